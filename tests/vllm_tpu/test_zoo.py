"""The vllm-tpu model zoo (configs/zoo-vllm-tpu.yaml) through the real CLI: every entry plans what vLLM 0.13's
TPU runner compiles, builds every planned graph on the CPU twin and verifies with 0 misses.

The MoE entries run vLLM's own TPU MoE (`forward_tpu` -> `moe_pallas.fused_moe`) with the twin's grouped
matmul in place of torch_xla's Pallas kernel. One build and one verify per entry, shared by its tests.
"""

from __future__ import annotations

import json

import pytest

from aotc.matrix import load_matrix
from aotc.plan import plan_entry

from ..conftest import CONFIGS, run_aotc
from .conftest import assert_built_as_planned, vllm_plan

ZOO = CONFIGS / "zoo-vllm-tpu.yaml"
ENTRIES = {entry.name: entry for entry in load_matrix(ZOO, check_stack=False).entries}
MOE_KEYS = ("num_experts", "num_local_experts")


def hf_config(entry) -> dict:
    return json.loads((ZOO.parent / entry.model / "config.json").read_text())


def test_the_zoo_holds_qwen3_moe_qwen2_moe_and_mixtral_entries_on_the_cpu_twin():
    architectures = {hf_config(e)["architectures"][0] for e in ENTRIES.values() if set(MOE_KEYS) & set(hf_config(e))}
    assert {"Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "MixtralForCausalLM"} <= architectures
    assert {(e.runner, e.device) for e in ENTRIES.values()} == {("vllm-tpu", "cpu")}


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_each_zoo_plan_is_vllms_own_capture_loops(name):
    """MoE adds no graph family to vLLM 0.13's capture_model (its experts are inside the backbone)."""
    entry = ENTRIES[name]
    assert [g.to_dict() for g in plan_entry(entry).graphs] == vllm_plan(entry.to_dict())


@pytest.fixture(scope="module", params=sorted(ENTRIES))
def built(request, tmp_path_factory):
    """(entry, `aotc build --json` entry report, artifact dir): one build per zoo entry."""
    entry = ENTRIES[request.param]
    out = tmp_path_factory.mktemp(f"zoo-{entry.model_name}")
    proc = run_aotc("build", ZOO, "--entry", entry.name, "--out", out, "--json", timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return entry, json.loads(proc.stdout)["entries"][0], out / entry.name


@pytest.fixture(scope="module")
def verified(built):
    entry, _, artifact = built
    proc = run_aotc("verify", artifact, "--json", "--seed", "7", "--traffic", "24", timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_zoo_entry_builds_every_planned_graph(built):
    assert_built_as_planned(*built)


@pytest.mark.slow
def test_zoo_entry_verifies_with_zero_misses_on_another_seed(built, verified):
    _, report, _ = built
    assert verified["misses"] == 0 and verified["missed"] == []
    assert verified["replayed_graphs"] == report["files"] and verified["traffic_requests"] >= 24
