"""A vision-language model end to end on the CPU twin, through the real CLI: the tiny Qwen2.5-VL of
configs/multimodal-jax.yaml builds every planned graph (the input-embeddings merger, the backbone over input
embeddings, tests/tpu_inference/test_plan_jax.py tying them to tpu-inference's own capture_model; and beyond
the warm-up the M-RoPE positions of every text prompt length and image grid), then a fresh server's verify
under text and image traffic, and the stock server under chat requests with images. One build, shared.

Not yet zero: tpu-inference keeps each request's M-RoPE positions, each encoder batch's pixels and each
image's encoder output as device arrays and slices, joins, pads and splits them in Python: small eager ops
shaped by the prompt length and the prefill chunk, or by which images share an encoder batch
(`jit_dynamic_slice` of the positions and pixels, `jit_concatenate` of an image prompt's position pieces and
of a step's image embeddings with their padding, `jit_broadcast_in_dim` for that padding, `jit_split` of a
multi-image encoder output, `jit_stage` lifting the batch's pixels), families quadratic in max_model_len or
combinatorial in the batch that no plan lists. The tests here hold every other graph to zero and name those
that remain.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aotc.graphs import GraphSpec
from aotc.matrix import load_matrix
from aotc.plan import plan_entry
from tests.conftest import run_aotc

from .conftest import REPO

CONFIG = REPO / "configs" / "multimodal-jax.yaml"
[ENTRY] = load_matrix(CONFIG).entries
MULTIMODAL_FAMILIES = {"input_embeddings_merger", "input_embeddings_merger_text_only", "backbone_with_embeds"}


# The eager ops the stack runs on per-request arrays (see above): their compiles remain.
PER_REQUEST_EAGER_OPS = ("jit_dynamic_slice", "jit_concatenate", "jit_broadcast_in_dim", "jit_split", "jit_stage")


@pytest.fixture(scope="module")
def built(jax_env, tmp_path_factory) -> tuple[Path, dict, Path]:
    """The build and a store holding it, published before verify records its misses (publish refuses those)."""
    from tests.helpers.canary import publish_copy

    out = tmp_path_factory.mktemp("multimodal")
    proc = run_aotc("build", CONFIG, "--out", out, "--traffic", "8", "--no-reuse", "--json", env=jax_env, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    [report] = json.loads(proc.stdout)["entries"]
    store, _ = publish_copy(out / ENTRY.name, tmp_path_factory.mktemp("multimodal-store"), jax_env)
    return out / ENTRY.name, report, store


def per_request_eager_op(key: str) -> bool:
    return Path(key).name.startswith(PER_REQUEST_EAGER_OPS)


def test_multimodal_plan_lists_the_vision_families_once_per_shape():
    plan = plan_entry(ENTRY)
    assert MULTIMODAL_FAMILIES <= set(plan.families())
    assert "vision_encoder" not in plan.families()  # no warm-up image shapes: the stack compiles none
    # M-RoPE positions are computed on the host (serving_fixes): no per-prompt-length family to compile
    assert "mrope_positions" not in plan.families()
    assert plan.families()["backbone_with_embeds"] == len(plan.buckets["token_paddings"])


@pytest.mark.slow
def test_multimodal_entry_builds_every_planned_graph_and_only_those(built):
    artifact, report, _ = built
    expected = plan_entry(ENTRY)
    assert report["ok"] and report["planned"] == report["graphs_with_keys"] == len(expected.graphs), report
    manifest = json.loads((artifact / "manifest.json").read_text())
    precompiled = [g for g in manifest["graphs"] if g["family"] in expected.families()]
    assert sorted(GraphSpec.from_dict(g).key for g in precompiled) == sorted(g.key for g in expected.graphs)
    assert all(g["keys"] for g in manifest["graphs"]), "a planned graph left no cache file"


@pytest.mark.slow
def test_multimodal_entry_verifies_under_image_traffic_but_per_request_eager_ops(built, jax_env, announce):
    """Every planned graph loads from the artifact; what a fresh server compiles under text and image traffic
    is only the per-request eager ops, none of them in a planned family or at start-up."""
    artifact, _, _ = built
    proc = run_aotc("verify", artifact, "--traffic", "8", "--json", env=jax_env, timeout=1800)
    result = json.loads(proc.stdout)
    announce(f"multimodal verify: {result['misses']} misses over {result['traffic_requests']} requests, "
             f"{result['replayed_graphs']} graphs replayed")
    assert result["traffic_requests"] > 0
    assert not any(row["deserialize_failures"] for row in result["families"].values())
    for family, count in plan_entry(ENTRY).families().items():
        assert result["families"][family]["loads"] >= count and not result["families"][family]["misses"], family
    assert all(m["family"] == "runtime" and per_request_eager_op(m["key"]) for m in result["missed"]), result["missed"]


@pytest.mark.slow
def test_multimodal_canary_stock_server_compiles_only_per_request_eager_ops(built, jax_env, announce):
    """The stock server, chat requests with images mixed with text: nothing compiles at start-up, the load runs
    to the end, and what compiles after ready is never a graph the artifact holds; it is the per-request eager
    ops (AOTC_GUARD=strict fails the requests whose step compiled one), of which concurrency can reach kinds
    the verify sweep did not (so only the artifact's keys are held to zero here)."""
    from tests.helpers.canary import canary

    artifact, _, store = built
    cached = {Path(key).name.removesuffix("-cache") for graph in json.loads((artifact / "manifest.json").read_text())
              ["graphs"] for key in graph["keys"]}
    code, doc, err = canary(CONFIG, ENTRY.name, store, jax_env, requests=32)
    announce(f"multimodal canary: {doc.get('requests')} of {doc.get('requests', 0) + doc.get('failed_requests', 0)} "
             f"requests served, {doc.get('compiles_after_ready')} compiles after ready")
    assert doc["compiles_at_startup"] == 0 and not doc["problems"], (doc.get("verdict"), err[-2000:])
    missed = doc["serving"]["misses"]
    assert missed and not set(missed) & cached, doc["serving"]
    announce(f"multimodal canary compiles outside the per-request eager ops: "
             f"{sorted({key.split('-')[0] for key in missed if not per_request_eager_op(key)})}")
