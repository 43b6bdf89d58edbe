"""TPU v7x (Ironwood) as a compile-only target: libtpu 0.0.48 names it ``tpu7x``, a v7x-8 (Cloud's tpu7x-8, one
host) is ``tpu7x:2x2x1``, four chips of two TensorCores, each TensorCore one JAX device of kind "TPU7x".

No TPU exists on this host: as in test_tpu_target_jax.py, what these tests show stops at the device boundary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from aotc.accelerators import parse_accelerator
from aotc.matrix import load_matrix
from aotc.plan import plan_entry
from aotc.runners.tpu_inference.topology import SINGLE_HOST_SLICES, targets_on_this_host, topology_for

from tests.conftest import run_aotc

from .conftest import PYTHON_ENV, REPO, run_jax

DEMO = REPO / "configs" / "demo-jax-tpu.yaml"  # the tiny Llama for a v6e-1, built here for a v7x-8 instead
ENTRY = "tiny-llama-jax--len128-seqs8-tok64-tp1"
FACTS = Path(__file__).with_name("tpu_target_facts.py")
V7X = topology_for("v7x-8")
TENSORCORES_PER_CHIP = 2


def test_doctor_lists_v7x_8_even_where_the_environment_names_another_stacks_libtpu(jax_env, monkeypatch):
    """The one refusal of tpu7x once seen ("Invalid TPU external name: TPU7x") was libtpu 0.0.21's, the torch_xla
    venv's, named by TPU_LIBRARY_PATH (importing that package sets it): doctor's targets still resolve v7x."""
    other_libtpu = subprocess.run([sys.executable, "-c", "import libtpu; print(libtpu.get_library_path())"],
                                  capture_output=True, text=True, check=True).stdout.strip()
    monkeypatch.setenv("TPU_LIBRARY_PATH", other_libtpu)
    targets = {row["accelerator"]: row for row in targets_on_this_host(jax_env[PYTHON_ENV])}
    assert set(targets) == set(SINGLE_HOST_SLICES) and not [row for row in targets.values() if "error" in row]
    v7x = targets["v7x-8"]
    assert v7x["topology"] == V7X.name == "tpu7x:2x2x1" and v7x["device_kind"] == "TPU7x", v7x
    assert v7x["devices"] == V7X.chips * TENSORCORES_PER_CHIP == 8, v7x
    # the matrix's tensor-parallel limit (aotc/accelerators.py) is what libtpu gives each single-host slice
    assert {name: parse_accelerator(name).host_devices for name in targets} == {
        name: row["devices"] for name, row in targets.items()}


# --- the JAX demo built for a v7x-8 on this host --------------------------------------------------


@pytest.fixture(scope="module")
def v7x_build(jax_env, tmp_path_factory):
    work = tmp_path_factory.mktemp("v7x")
    config = work / "demo-v7x.yaml"
    config.write_text(DEMO.read_text().replace("./models/tiny-llama", str(REPO / "configs" / "models" / "tiny-llama"))
                      .replace("accelerator: v6e-1", "accelerator: v7x-8"))
    proc = run_aotc("build", config, "--out", work / "out", "--json", env=jax_env, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    plan = plan_entry(load_matrix(config).entry(ENTRY))
    return work / "out" / ENTRY, json.loads(proc.stdout)["entries"][0], plan


@pytest.mark.slow
def test_the_demo_builds_for_v7x_every_planned_graph(v7x_build):
    _, report, plan = v7x_build
    assert report["ok"] and report["graphs_with_keys"] == report["planned"] == len(plan.graphs), report


@pytest.mark.slow
def test_the_manifest_records_v7x_as_libtpu_and_the_stack_count_it(v7x_build):
    """Two JAX devices a chip; the stack's HBM limit per device (get_device_hbm_limit) is half the chip's."""
    target = json.loads((v7x_build[0] / "manifest.json").read_text())["target"]
    assert target["topology"] == V7X.name and target["device_kind"] == "TPU7x" and target["hosts"] == 1, target
    assert target["devices"] == target["chips"] * TENSORCORES_PER_CHIP == 8, target
    assert target["hbm_bytes_per_device"] * TENSORCORES_PER_CHIP == target["hbm_bytes_per_chip"], target


@pytest.mark.slow
def test_every_v7x_cache_entry_is_a_tpu_executable_and_attention_holds_the_stacks_pallas_kernel(jax_env, v7x_build):
    artifact = v7x_build[0]
    manifest = json.loads((artifact / "manifest.json").read_text())
    facts = run_jax(jax_env, FACTS, {"accelerators": ["v7x-8"], "artifact_cache": str(artifact / "cache")})
    entries = facts["entries"]
    assert set(entries) == {f["path"] for f in manifest["files"]}
    assert not [name for name, entry in entries.items() if entry["host_code"]]
    backbone_keys = {key for g in manifest["graphs"] if g["family"] == "backbone" for key in g["keys"]}
    assert backbone_keys and all(entries[key]["pallas"] for key in backbone_keys)
    limit = manifest["target"]["hbm_bytes_per_device"]
    assert all(0 < g["compiled"]["peak_memory_bytes"] <= limit for g in manifest["graphs"] if g["family"] != "startup")
    assert manifest["target"]["topology_fingerprint"] == facts["topologies"]["v7x-8"]["topology_fingerprint"]
