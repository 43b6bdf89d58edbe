"""The model zoo end to end on the CPU twin, through the real CLI: each entry of configs/zoo-jax.yaml (dense
Qwen2, tied on the JAX path and untied through torchax, and Qwen3; the MoE architectures, through twin.moe where
the model takes tpu-inference's GMM backend; DeepSeek V3, JAX-native and through vLLM's model, on the MLA
kernel's twin; the hybrid Qwen3-Next on the GDN kernel's twin, with and without prefix caching) builds
every planned graph, a fresh process replays it with zero misses, and for one model of each MoE path and for
DeepSeek V3 the stock server compiles nothing after ready. One build per entry.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from aotc.graphs import GraphSpec
from aotc.matrix import load_matrix
from aotc.plan import plan_entry
from tests.conftest import run_aotc
from tests.support_cases import ZOO_JAX_CANARIES

from .conftest import REPO

ZOO = REPO / "configs" / "zoo-jax.yaml"
# Every entry of the zoo matrix, by name.
ENTRIES = {entry.model_name: entry for entry in load_matrix(ZOO, check_stack=False).entries}


def plan(model: str):
    # Expected counts come from the plan (tests/tpu_inference/test_plan_jax.py ties it to tpu-inference's own loops).
    return plan_entry(ENTRIES[model])


@pytest.fixture(scope="module", params=sorted(ENTRIES))
def built(request, jax_env, tmp_path_factory) -> tuple[str, Path, dict]:
    model = request.param
    entry = ENTRIES[model].name
    out = tmp_path_factory.mktemp(f"zoo-{model}")
    proc = run_aotc("build", ZOO, "--entry", entry, "--out", out, "--traffic", "16", "--no-reuse", "--json",
                    env=jax_env, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    [report] = json.loads(proc.stdout)["entries"]
    return model, out / entry, report


@pytest.mark.slow
def test_zoo_entry_builds_every_planned_graph_and_only_those(built):
    model, artifact, report = built
    expected = plan(model)
    assert report["ok"] and report["planned"] == report["graphs_with_keys"] == len(expected.graphs)
    manifest = json.loads((artifact / "manifest.json").read_text())
    precompiled = [g for g in manifest["graphs"] if g["family"] in expected.families()]
    assert sorted(GraphSpec.from_dict(g).key for g in precompiled) == sorted(g.key for g in expected.graphs)
    # the rest is the engine's start-up and the traffic sweep's steps, which the plan does not list
    assert {g["family"] for g in manifest["graphs"]} - set(expected.families()) <= {"startup", "runtime"}
    assert all(g["keys"] for g in manifest["graphs"]), "a planned graph left no cache file"


@pytest.mark.slow
def test_plan_names_the_mesh_the_stack_built(built):
    """The plan's mesh (a fingerprint input) is the one tpu-inference's runner logged creating, axis by axis
    in order: the 2-D mesh by default, the 7-axis one under NEW_MODEL_DESIGN (Llama 4)."""
    model, artifact, _ = built
    line = next(line for line in (artifact / "build.log").read_text().splitlines() if "Init mesh | mesh=" in line)
    logged = [(axis, int(size)) for axis, size in re.findall(r"'(\w+)': (\d+)", line)]
    assert list(plan(model).buckets["mesh"]["axes"].items()) == logged


@pytest.mark.slow
def test_zoo_entry_verifies_with_zero_misses_and_real_loads(built, jax_env):
    model, artifact, _ = built
    proc = run_aotc("verify", artifact, "--traffic", "24", "--json", env=jax_env, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout)
    assert result["misses"] == 0 and result["loadable"] is True
    planned = plan(model).families()
    # every planned family was replayed by the fresh server and read back from the cache
    assert all(result["families"][family]["loads"] >= count for family, count in planned.items()), result["families"]


# The stock server for one MoE model of each path a canary reaches differently (every entry builds and
# verifies above): torchax through vLLM's model (Qwen3-Next, whose MoE takes the path Qwen3-MoE's does, and the
# one model on the linear-attention path, here with prefix caching: its state saved per block and resumed from
# it) and tpu-inference's JAX-native model; DeepSeek V3, the one model on the MLA attention path; and Qwen3.5 MoE
# drafting with its MTP layer, the one MoE whose server takes draft tokens. The suite's time budget buys four
# canaries, not one per entry.
CANARY_MODELS = list(ZOO_JAX_CANARIES)  # docs/support.md's table reads the same list


@pytest.mark.slow
@pytest.mark.parametrize("built", CANARY_MODELS, indirect=True)
def test_moe_entry_canary_stock_server_compiles_nothing_after_ready(built, jax_env, tmp_path, announce):
    from tests.helpers.canary import canary, publish_copy

    model, artifact, _ = built
    store, _ = publish_copy(artifact, tmp_path, jax_env)
    code, doc, err = canary(ZOO, ENTRIES[model].name, store, jax_env, requests=100)
    assert code == 0, (doc.get("verdict"), doc.get("problems"), err[-2000:])
    assert doc["compiles_at_startup"] == 0 and doc["compiles_after_ready"] == 0
    assert doc["requests"] >= 100 and doc["failed_requests"] == 0
    if ENTRIES[model].engine.get("enable_prefix_caching"):
        # the shared-prefix requests took cached blocks (Qwen3-Next: and the state saved with them)
        assert doc["prefix_cache"]["hits"] > 0, doc["prefix_cache"]
    if ENTRIES[model].engine.get("speculative_config"):
        served = doc["kinds"]["speculative"]
        assert served["sent"] > 0 and served["ok"] == served["sent"], served
    announce(f"canary {model}: {doc['requests']} requests, {doc['compiles_after_ready']} compiles after ready, "
             f"prefix cache {doc['prefix_cache']}")


def test_a_target_the_stack_runs_on_vllms_model_drafts_only_with_its_draft_set_to_vllm():
    """tpu-inference prefers vLLM's model for Qwen3.5 MoE and resolves its MTP draft to flax_nnx under auto, and its
    drafter refuses a draft on another implementation (rules.draft_implementation, held to the stack in
    test_plan_jax.py): the zoo entry sets DRAFT_MODEL_IMPL_TYPE: vllm, without which the plan names the variable.
    Dense Qwen3.5's target resolves as its draft does and needs nothing."""
    import dataclasses

    from aotc.entry import hf_config
    from aotc.runners.tpu_inference.plan import rules

    entry = ENTRIES["qwen3_5-moe-mtp"]
    assert entry.env["DRAFT_MODEL_IMPL_TYPE"] == "vllm" and rules.draft_implementation(entry, hf_config(entry)) == []
    unset = dataclasses.replace(entry, env={})
    [reason] = rules.draft_implementation(unset, hf_config(unset))
    assert reason.startswith("env.DRAFT_MODEL_IMPL_TYPE:") and reason.endswith("set DRAFT_MODEL_IMPL_TYPE: vllm")
    dense_model = REPO / "configs" / "models" / "tiny-qwen3_5"
    dense = dataclasses.replace(unset, model=str(dense_model), model_path=str(dense_model))
    assert rules.draft_implementation(dense, hf_config(dense)) == []


# tpu-inference's JAX architectures the twins do not build yet, each with the reason (docs/support.md).
NOT_YET: dict[str, str] = {}
# The matrices whose entries build on the twin in the suite (zoo, demo, features, multimodal).
BUILT_MATRICES = ("zoo-jax.yaml", "demo-jax.yaml", "features-jax.yaml", "multimodal-jax.yaml")


def built_architectures() -> set[str]:
    """Every architecture a suite matrix builds on tpu-inference's JAX path (not through vLLM's model): its
    models', and a draft's as vLLM names it (EAGLE-3: Eagle3<arch>; DFlash: DFlash<arch> unless the name has
    DFlash already; a Gemma 4 assistant: Gemma4MTPModel, SpeculativeConfig.hf_config_override)."""
    from aotc.entry import hf_config
    from aotc.runners.tpu_inference.plan.rules import on_jax_path

    found: set[str] = set()
    for name in BUILT_MATRICES:
        for entry in load_matrix(REPO / "configs" / name, check_stack=False).entries:
            if not on_jax_path(entry):
                continue
            found.update(hf_config(entry)["architectures"])
            spec = entry.engine.get("speculative_config") or {}
            draft = json.loads((Path(spec["model"]) / "config.json").read_text()) if spec.get("model") else {}
            if spec.get("method") == "eagle3":
                found.update(f"Eagle3{arch}" for arch in draft["architectures"])
            if spec.get("method") == "dflash":
                found.update(a if a.startswith("DFlash") or a.endswith("DFlash") else f"DFlash{a}"
                             for a in draft["architectures"])
            if spec.get("method") == "mtp" and draft.get("model_type") == "gemma4_assistant":
                found.add("Gemma4MTPModel")
    return found


def test_every_jax_architecture_of_the_stack_is_built_or_named_not_yet(stack_readers):
    """The zoo keeps up with tpu-inference's JAX registry: an architecture the stack adds, or one a matrix starts
    building, fails this until the list above (and docs/support.md's table) says so."""
    class_of = stack_readers["jax_registry.py"]  # tpu-inference's registry: architecture -> its class
    registry = set(class_of)
    # a name the registry maps to a class a matrix builds under another name is built too (DFlash's two names)
    built_classes = {class_of[name] for name in built_architectures() & registry}
    built = {name for name in registry if class_of[name] in built_classes}
    assert built | set(NOT_YET) == registry, sorted(registry - built - set(NOT_YET))
    assert not built & set(NOT_YET), sorted(built & set(NOT_YET))
