"""TPU executables from a host without a TPU: a `device: tpu` entry of the tpu-inference runner builds here with
libtpu's compiler on the accelerator's compile-only devices (aotc/runners/tpu_inference/compile_only.py).

No TPU exists on this host: what these tests show stops at the device boundary. They show that every planned
graph compiles for the TPU with the stack's own kernels, that the artifact holds TPU executables keyed as JAX
keys them, and that a fresh process computes the same keys. That a TPU loads and runs them, only `aotc verify`
on a TPU host of that topology shows."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from aotc.matrix import load_matrix
from aotc.plan import plan_entry
from aotc.runners.tpu_inference.topology import SINGLE_HOST_SLICES

from .conftest import REPO, run_jax

DEMO = REPO / "configs" / "demo-jax-tpu.yaml"
ENTRY = "tiny-llama-jax--len128-seqs8-tok64-tp1"
PLAN = plan_entry(load_matrix(DEMO, check_stack=False).entry(ENTRY))
FACTS = Path(__file__).with_name("tpu_target_facts.py")
# Cloud TPU single-host slices of every generation aotc targets, and one multi-host slice
ACCELERATORS = [*SINGLE_HOST_SLICES, "v6e-16"]
DEVICE_KINDS = {"v5e": "TPU v5 lite", "v6e": "TPU v6 lite", "v5p": "TPU v5", "v7x": "TPU7x"}


def aotc(jax_env, *args: str, timeout: float = 1500) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aotc.cli", *map(str, args)], capture_output=True, text=True,
                          env=jax_env, cwd=REPO, timeout=timeout)


@pytest.fixture(scope="module")
def facts(jax_env) -> dict:
    return run_jax(jax_env, FACTS, {"accelerators": ACCELERATORS})


def test_each_accelerator_names_a_libtpu_topology_of_its_chips_on_its_hosts(facts):
    for accelerator in ACCELERATORS:
        row = facts["topologies"][accelerator]
        generation, count = accelerator.split("-")
        assert row["device_kind"] == DEVICE_KINDS[generation] and row["platform"] == "tpu", row
        # v5e and v6e names count chips, v5p and v7x TensorCores; a v7x chip is two JAX devices
        assert row["chips"] == int(count) // (2 if generation in ("v5p", "v7x") else 1), row
        assert row["devices"] == row["chips"] * (2 if generation == "v7x" else 1), row
        assert len(row["processes"]) == row["hosts"], row
    assert facts["topologies"]["v6e-8"]["hosts"] == 1 and facts["topologies"]["v6e-16"]["hosts"] == 4


def test_another_stacks_libtpu_named_by_the_environment_is_not_the_compiler(jax_env, facts):
    """Importing the torch_xla venv's libtpu package (0.0.21) sets TPU_LIBRARY_PATH in that process and every one
    it starts: a TPU target still compiles with this stack's libtpu (the version the fingerprint names)."""
    core_libtpu = subprocess.run([sys.executable, "-c", "import libtpu; print(libtpu.get_library_path())"],
                                 capture_output=True, text=True, check=True).stdout.strip()
    polluted = run_jax({**jax_env, "TPU_LIBRARY_PATH": core_libtpu}, FACTS, {"accelerators": ["v6e-1"]})
    assert polluted["platform_version"] == facts["platform_version"]
    assert polluted["call_keys"] == facts["call_keys"]


def test_the_host_split_is_part_of_the_key_so_a_single_host_slice_is_built_as_one_host(facts):
    one_host, two_hosts = facts["host_split_fingerprints"]
    assert one_host != two_hosts
    assert facts["topologies"]["v6e-8"]["topology_fingerprint"] == one_host


def test_a_multi_host_slice_is_refused_with_its_reason(facts):
    assert "v6e-16: a 4-host slice (v6e:4x4)" in facts["multi_host_refusal"]


def test_a_call_on_abstract_arrays_compiles_under_the_key_of_the_stacks_own_lowering(facts):
    """The stack's RPA kernel on the v6e-1 topology: a jitted call on abstract arrays (a compile-only build's path for
    the warm-up's calls) and jax.jit(...).lower(...).compile() (the stack's AOT path) write one same cache key."""
    assert facts["call_keys"] and facts["call_keys"] == facts["lowered_keys"]


def test_hbm_in_use_counts_every_array_held_on_the_device_equal_ones_too(facts):
    """What the stack's KV sizing subtracts: three equal weights (as a model's layers are) are three."""
    assert facts["held_bytes"] == 3 * facts["one_weight_bytes"]


def test_the_stacks_host_side_dummy_weights_are_never_made_on_the_host(facts):
    """tpu-inference makes each dummy weight on the host (jax.random under its CPU mesh) before placing it: a
    real-size model would need its whole size in host RAM. Under a TPU target the weight is abstract there and
    counts on the device it is placed on, so the stack's KV sizing still subtracts it."""
    weight = facts["host_weight"]
    assert weight["type"] == weight["placed_type"] == "AbstractArray", weight
    assert weight["host_growth"] < weight["bytes"] // 4, weight
    assert weight["held_growth"] == weight["bytes"], weight


def test_a_torch_models_weight_is_placed_abstract_and_never_made_on_the_host(facts):
    """vLLM's PyTorch model (the stack's torchax path) is made on the meta device in a compile-only build: the stack's
    own conversion and placing give an abstract array on the device, which torch wraps as a Parameter (before: the
    placing stopped at ``'AbstractArray' object has no attribute 'detach'``), and the device holds its bytes."""
    weight = facts["torch_weight"]
    assert weight["placed_type"] == "AbstractArray" and weight["parameter_shape"] == [8192, 65536], weight
    assert weight["host_growth"] < weight["bytes"] // 4, weight
    assert weight["held_growth"] == weight["bytes"], weight


def test_a_weight_placed_with_a_layout_counts_on_the_device_it_is_placed_on(facts):
    """The stack places MoE weights and its RoPE table with a Format (layout and sharding): the placed weight has the
    Format's sharding, so the KV sizing subtracts its bytes per device (before, it kept the source's placement:
    Qwen3-30B-A3B on a v6e-4 counted its experts whole on each chip, 66.75 GiB, and the sizing refused)."""
    weight = facts["torch_weight"]
    assert weight["laid_out_type"] == "AbstractArray" and weight["laid_out_held_growth"] == weight["bytes"], weight


def test_the_twin_and_a_tpu_target_never_share_a_process(facts):
    """A TPU graph must never hold one of the twin's stand-ins: each refuses where the other is on."""
    assert "CPU twin" in facts["twin_flag_refusal"]
    assert "compiles for a TPU" in facts["twin_after_target_refusal"]


# --- the JAX demo built for a v6e-1 on this host --------------------------------------------------


@pytest.fixture(scope="module")
def build(jax_env, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("tpu-artifacts")
    proc = aotc(jax_env, "build", DEMO, "--out", out, "--json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout)["entries"][0]
    assert report["ok"] and report["graphs_with_keys"] == report["planned"] == len(PLAN.graphs), report
    return out / ENTRY, proc


@pytest.fixture(scope="module")
def artifact(build) -> Path:
    return build[0]


@pytest.mark.slow
def test_the_build_says_it_compiles_for_the_tpu_and_runs_no_traffic(build):
    progress = [line for line in build[1].stderr.splitlines() if line.startswith(f"aotc build: {ENTRY}: compiling")]
    assert progress == [f"aotc build: {ENTRY}: compiling {len(PLAN.graphs)} planned graphs for its TPU, compile-only "
                        "(no traffic sweep: this host has no TPU to run it)"], progress


@pytest.mark.slow
def test_each_familys_progress_line_covers_its_compiles(build, manifest):
    """A family's line comes when it has compiled, with the wall around its compiles: the backbone, which the stack's
    AOT pass skips and its warm-up compiles, once said 0.0 s there."""
    said: dict[str, float] = {}
    for family, seconds in re.findall(rf"aotc build: {re.escape(ENTRY)}: (\w+) compiled in ([\d.]+)s", build[1].stderr):
        said[family] = said.get(family, 0.0) + float(seconds) + 0.05  # each line rounds to 0.1 s
    assert set(said) == set(PLAN.families()), said
    for family in PLAN.families():
        compiled = sum(g["compile_seconds"] for g in manifest["graphs"] if g["family"] == family)
        assert said[family] >= compiled > 0, (family, said[family], compiled)


def families_built(manifest: dict) -> dict[str, int]:
    """Graphs per planned family in a manifest, each with its cache keys (start-up graphs are not planned)."""
    built: dict[str, int] = {}
    for graph in manifest["graphs"]:
        if graph["family"] != "startup":
            assert graph["keys"], graph
            built[graph["family"]] = built.get(graph["family"], 0) + 1
    return built


def backbone_keys_without_the_pallas_kernel(entries: dict, manifest: dict) -> list[str]:
    """Every entry is checked for host code first (a TPU executable holds none); then the backbone's keys whose
    decoded executable holds no Pallas kernel call (the stack's attention)."""
    assert entries and not [name for name, entry in entries.items() if entry["host_code"]]
    backbone = sorted({key for g in manifest["graphs"] if g["family"] == "backbone" for key in g["keys"]})
    assert backbone
    return [key for key in backbone if not entries[key]["pallas"]]


@pytest.fixture(scope="module")
def manifest(artifact) -> dict:
    return json.loads((artifact / "manifest.json").read_text())


@pytest.fixture(scope="module")
def entry_facts(jax_env, artifact) -> dict:
    return run_jax(jax_env, FACTS, {"accelerators": ["v6e-1"], "artifact_cache": str(artifact / "cache")})


@pytest.mark.slow
def test_every_planned_graph_is_built_for_the_tpu_family_by_family(manifest):
    assert families_built(manifest) == PLAN.families()


@pytest.mark.slow
def test_the_manifest_records_the_target_as_libtpu_reports_it(manifest, entry_facts):
    target = manifest["target"]
    assert target["platform"] == "tpu" and target["device_kind"] == "TPU v6 lite" and target["topology"] == "v6e:1x1"
    assert target["compile_only"] is True and target["accelerator"] == "v6e-1"
    # the platform version JAX hashes into every key: libtpu's own build string, as the target's client says it
    assert target["platform_version"] == entry_facts["platform_version"]
    assert target["topology_fingerprint"] == entry_facts["topologies"]["v6e-1"]["topology_fingerprint"]


@pytest.mark.slow
def test_every_cache_entry_is_a_tpu_executable_and_attention_holds_the_stacks_pallas_kernel(manifest, entry_facts):
    entries = entry_facts["entries"]
    assert entry_facts["cpu_entry_has_host_code"]  # the check sees host code where there is some
    assert set(entries) == {f["path"] for f in manifest["files"]}
    assert backbone_keys_without_the_pallas_kernel(entries, manifest) == []
    sample_keys = {key for g in manifest["graphs"] if g["family"] == "sample" for key in g["keys"]}
    assert not any(entries[key]["pallas"] for key in sample_keys)


@pytest.mark.slow
def test_each_graph_carries_the_compilers_figures_within_the_chips_hbm(manifest):
    limit = manifest["target"]["hbm_bytes_per_device"]
    kv_blocks = manifest["inputs"]["kv_blocks"]
    planned = [g for g in manifest["graphs"] if g["family"] != "startup"]
    for graph in planned:
        figures = graph["compiled"]
        assert figures["generated_code_bytes"] > 0 and 0 < figures["peak_memory_bytes"] <= limit, graph
    # the stack sized the KV cache against the chip's HBM: the backbone takes it as an argument
    backbone = max(g["compiled"]["argument_bytes"] for g in planned if g["family"] == "backbone")
    assert kv_blocks > 1000 and backbone > limit // 2, (kv_blocks, backbone)


@pytest.mark.slow
def test_a_fresh_process_finds_every_key_and_says_the_load_is_unproven(jax_env, artifact):
    proc = aotc(jax_env, "verify", artifact, "--json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout)
    assert result["misses"] == 0 and result["loadable"] is False
    assert result["verdict"].startswith("covered, loadability unproven") and "v6e:1x1" in result["unproven"]
    assert result["families"]["backbone"]["found"] == PLAN.families()["backbone"]
    recorded = json.loads((artifact / "manifest.json").read_text())
    assert recorded["verify_unproven"] == result["unproven"] and recorded["verify"]["loadable"] is False


@pytest.mark.slow
def test_an_entry_over_the_chips_hbm_fails_the_build_naming_the_graph(jax_env, tmp_path):
    """A v5e chip has 16 GiB: a KV cache pinned at 600,000 blocks of 16 tokens does not fit beside the weights. The TPU
    compiler refuses the backbone itself; the build names the graph and says the compiler's words."""
    config = tmp_path / "too-big.yaml"
    config.write_text(DEMO.read_text().replace("./models/tiny-llama", str(REPO / "configs" / "models" / "tiny-llama"))
                      .replace("accelerator: v6e-1", "accelerator: v5e-1\n  engine: {num_gpu_blocks_override: 600000}")
                      .replace("max_num_batched_tokens: [64]", "max_num_batched_tokens: [16]"))
    proc = aotc(jax_env, "build", config, "--out", tmp_path / "out", "--json")
    assert proc.returncode == 1, proc.stderr[-3000:]
    error = json.loads(proc.stdout)["entries"][0]["error"]
    assert error.startswith("GraphCompileFailed: backbone {") and "Ran out of memory on HBM" in error, error


# --- a model tpu-inference serves through vLLM's PyTorch model (torchax), built for a v6e-1 on this host ---------

TORCHAX_MODEL = REPO / "configs" / "models" / "tiny-qwen3-moe"


@pytest.fixture(scope="module")
def torchax_build(jax_env, tmp_path_factory) -> tuple[Path, dict, object]:
    """Qwen3-MoE, outside tpu-inference's JAX registry: the stack serves vLLM's Qwen3MoeForCausalLM through torchax
    (MODEL_IMPL_TYPE auto resolves to vllm). Its torch model is made on the meta device, its weights placed as
    abstract arrays with the stack's own shardings, and the warm-up's calls compile for the TPU."""
    tmp = tmp_path_factory.mktemp("torchax")
    config = tmp / "moe.yaml"
    config.write_text(DEMO.read_text().replace("./models/tiny-llama", str(TORCHAX_MODEL)))
    proc = aotc(jax_env, "build", config, "--out", tmp / "out", "--json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return tmp / "out" / ENTRY, json.loads(proc.stdout)["entries"][0], plan_entry(load_matrix(config).entry(ENTRY))


@pytest.mark.slow
def test_a_model_served_through_torchax_builds_every_planned_graph_for_the_tpu(torchax_build):
    artifact, report, plan = torchax_build
    assert "Resolved MODEL_IMPL_TYPE 'auto' to 'vllm'" in (artifact / "build.log").read_text()
    assert report["ok"] and report["graphs_with_keys"] == report["planned"] == len(plan.graphs), report
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert families_built(manifest) == plan.families()
    assert manifest["target"]["platform"] == "tpu" and manifest["target"]["topology"] == "v6e:1x1"


@pytest.mark.slow
def test_the_torchax_models_entries_are_tpu_executables_with_the_stacks_attention_kernel(jax_env, torchax_build):
    artifact, _, _ = torchax_build
    entries = run_jax(jax_env, FACTS, {"accelerators": ["v6e-1"], "artifact_cache": str(artifact / "cache")})["entries"]
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert backbone_keys_without_the_pallas_kernel(entries, manifest) == []


@pytest.mark.slow
def test_a_fresh_process_finds_every_key_of_the_torchax_models_build(jax_env, torchax_build):
    artifact, _, plan = torchax_build
    proc = aotc(jax_env, "verify", artifact, "--json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout)
    assert result["misses"] == 0 and result["loadable"] is False and "v6e:1x1" in result["unproven"]
    # on this path each backbone graph is two executables of the step function, both in the manifest: all are found
    manifest = json.loads((artifact / "manifest.json").read_text())
    keys = {family: sum(len(g["keys"]) for g in manifest["graphs"] if g["family"] == family) for family in plan.families()}
    assert {family: result["families"][family]["found"] for family in plan.families()} == keys
