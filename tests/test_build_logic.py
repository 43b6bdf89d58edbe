"""Build and verify bookkeeping that needs no compiler: shards, plan checks, the honest verdict."""

import pytest

from aotc.build import plan_coverage, shard_entries
from aotc.errors import BadInput
from aotc.manifest import Manifest
from aotc.matrix import load_matrix
from aotc.plan import plan_entry
from aotc.runners.protocol import BuildResult, Graph
from aotc.runners.protocol import VerifyResult as RunnerVerify
from aotc.verify import _result

from .conftest import CONFIGS

EXAMPLE = load_matrix(CONFIGS / "example-tpu.yaml", check_stack=False)


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


def test_plan_coverage_names_missing_empty_and_unplanned_graphs():
    p = plan()
    # the runner reports calls in its own order, shapes with keys in any order, some graphs twice
    calls = [Graph(family=g.family, shape=dict(reversed(g.shape)), keys=[f"tp1_rank0/{i}"])
             for i, g in enumerate(reversed(p.graphs))]
    graphs, problems = plan_coverage(p, BuildResult(calls=calls + calls[:2]))
    assert problems == []
    assert [(g.family, g.shape) for g in graphs] == [(s.family, s.shape_dict) for s in p.graphs]
    assert all(len(g.keys) == 1 for g in graphs)

    empty = calls[:]
    empty[-4] = empty[-4].model_copy(update={"keys": []})  # p.graphs[3]
    extra = Graph(family="backbone", shape={"num_tokens": 7}, keys=["tp1_rank0/x"])
    _, problems = plan_coverage(p, BuildResult(calls=empty[1:] + [extra]))
    assert problems == [
        f"planned graph produced no cache entry: {p.graphs[3].family}[{p.graphs[3].label}]",
        f"planned graph was never compiled by the runner: {p.graphs[-1].family}[{p.graphs[-1].label}]",
        "capture compiled a graph the plan does not list: backbone[num_tokens=7]",
    ]


def manifest():
    return Manifest(entry="e", fingerprint="f" * 64, inputs={}, created="", aotc_version="", runner="vllm-tpu",
                    device="cpu")


def test_verdict_never_claims_a_load_that_did_not_happen():
    raw = RunnerVerify.model_validate({"families": {"backbone": {"found": 6, "deserialize_failures": 6}},
                                       "loadable": True, "replayed_graphs": 6})
    result = _result(None, manifest(), raw, seed=1)
    assert result.ok and not result.loadable
    assert result.verdict.startswith("covered, not loadable")


def test_verdict_loadable_needs_hits_and_no_failures():
    raw = RunnerVerify.model_validate({"families": {"backbone": {"found": 6, "loads": 6}}, "loadable": True})
    assert _result(None, manifest(), raw, seed=1).loadable


def test_a_miss_fails_and_names_the_family():
    raw = RunnerVerify.model_validate({"families": {"gather_logprobs": {"misses": 1}}, "misses": 1, "missed": [
        {"family": "gather_logprobs", "shape": {"num_reqs": 8}, "key": "tp1_rank0/x"}]})
    result = _result(None, manifest(), raw, seed=1)
    assert not result.ok and "gather_logprobs" in result.verdict


def test_a_misspelled_key_in_a_runner_result_fails_instead_of_counting_zero():
    with pytest.raises(ValueError, match="hits"):
        RunnerVerify.model_validate({"families": {"backbone": {"hits": 6}}})
    with pytest.raises(ValueError, match="graphs"):
        BuildResult.model_validate({"graphs": []})
