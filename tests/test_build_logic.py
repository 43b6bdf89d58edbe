"""Build and verify bookkeeping that needs no compiler: shards, plan checks, the honest verdict."""

import pytest

from aotc.build import build_problems, shard_entries
from aotc.errors import BadInput
from aotc.manifest import Manifest
from aotc.matrix import load_matrix
from aotc.plan import plan_entry
from aotc.verify import _result

from .conftest import CONFIGS

EXAMPLE = load_matrix(CONFIGS / "example-tpu.yaml")


@pytest.mark.parametrize("count", [1, 2, 3, 5, 24, 30])
def test_shards_are_disjoint_and_cover_the_matrix(count):
    shards = [shard_entries(list(EXAMPLE.entries), f"{i}/{count}") for i in range(count)]
    names = [e.name for shard in shards for e in shard]
    assert len(names) == len(set(names)) == len(EXAMPLE.entries)
    assert shards == [shard_entries(list(reversed(EXAMPLE.entries)), f"{i}/{count}") for i in range(count)]


@pytest.mark.parametrize("bad", ["3/3", "-1/2", "a/b", "1", "1/0"])
def test_bad_shard_is_bad_input(bad):
    with pytest.raises(BadInput):
        shard_entries(list(EXAMPLE.entries), bad)


def plan():
    return plan_entry(EXAMPLE.entries[0])


def test_build_problems_name_missing_and_unplanned_graphs():
    p = plan()
    graphs = [g.to_dict() | {"keys": ["tp1_rank0/1"]} for g in p.graphs]
    assert build_problems(p, {"graphs": graphs}) == []
    graphs[3]["keys"] = []
    problems = build_problems(p, {"graphs": graphs, "unplanned": [{"family": "backbone", "shape": {"num_tokens": 7}}]})
    assert problems[0].startswith(f"planned graph produced no cache entry: {p.graphs[3].family}[")
    assert problems[1] == "capture compiled a graph the plan does not list: backbone[num_tokens=7]"


def manifest():
    return Manifest(entry="e", fingerprint="f" * 64, inputs={}, created="", aotc_version="", runner="vllm-tpu",
                    device="cpu")


def test_verdict_never_claims_a_load_that_did_not_happen():
    raw = {"families": {"backbone": {"misses": 0, "hits": 6, "loads": 0, "deserialize_failures": 6}},
           "misses": 0, "loadable": True, "replayed_graphs": 6}
    result = _result(None, manifest(), raw, seed=1)
    assert result.ok and not result.loadable
    assert result.verdict.startswith("covered, not loadable")


def test_verdict_loadable_needs_hits_and_no_failures():
    raw = {"families": {"backbone": {"misses": 0, "hits": 6, "loads": 6, "deserialize_failures": 0}},
           "misses": 0, "loadable": True}
    assert _result(None, manifest(), raw, seed=1).loadable


def test_a_miss_fails_and_names_the_family():
    raw = {"families": {"gather_logprobs": {"misses": 1}}, "misses": 1,
           "missed": [{"family": "gather_logprobs", "shape": {"num_reqs": 8}}]}
    result = _result(None, manifest(), raw, seed=1)
    assert not result.ok and "gather_logprobs" in result.verdict
