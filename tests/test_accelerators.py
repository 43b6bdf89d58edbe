"""A pod's accelerator in Cloud's names (GKE's TPU_ACCELERATOR_TYPE: tpu7x-8, v5litepod-4) is the matrix's
(v7x-8, v5e-4) when the guard checks the fetched artifact (aotc/accelerators.py). The matrix's own refusals
and limits are in tests/bad_configs/ (test_matrix.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from aotc import guard
from aotc.matrix import parse_matrix

from .test_guard import ENV, demo_entry, launched, vllm_config, write_manifest

ON_A_TPU = {"runner": "vllm-tpu", "device": "tpu"}  # what the vllm-tpu watcher reports on a TPU host


def tpu_entry(accelerator: str):
    """The demo entry as built for a TPU (its KV block count pinned: no TPU here to size it)."""
    return replace(demo_entry(), device="tpu", accelerator=accelerator, engine={"num_gpu_blocks_override": 65})


@pytest.mark.parametrize("gke_name, matrix_name", [("tpu7x-8", "v7x-8"), ("v5litepod-4", "v5e-4"),
                                                   ("v6e-8", "v6e-8"), ("v5p-8", "v5p-8")])
def test_a_pod_named_by_gke_matches_the_artifact_of_its_matrix_accelerator(tmp_path, gke_name, matrix_name):
    entry = tpu_entry(matrix_name)
    write_manifest(tmp_path, entry, ENV)
    pod = launched(entry, {**ENV, guard.GKE_ACCELERATOR_ENV: gke_name})
    check = guard.check_cache(str(tmp_path), vllm_config(entry), pod, **ON_A_TPU)
    assert check.status == "match", check.line  # before: "accelerator: here 'tpu7x-8', published 'v7x-8'"


def test_a_pod_on_another_slice_is_still_a_mismatch_naming_the_accelerator(tmp_path):
    entry = tpu_entry("v7x-8")
    write_manifest(tmp_path, entry, ENV)
    pod = launched(entry, {**ENV, guard.GKE_ACCELERATOR_ENV: "tpu7x-16"})
    check = guard.check_cache(str(tmp_path), vllm_config(entry), pod, **ON_A_TPU)
    assert check.status == "mismatch" and [d.split(":")[0] for d in check.differences] == ["accelerator"], check.line
    assert "v7x-16" in check.line, check.line


@pytest.mark.parametrize("accelerator, tp", [("v7x-8", 8), ("v5p-8", 4), ("v6e-16", 4), ("v5p-384", 4)])
def test_a_tensor_parallel_group_of_one_hosts_devices_is_accepted(accelerator, tp):
    matrix = parse_matrix(f"""
models: [{{name: a, model: m, accelerator: {accelerator},
          matrix: {{max_model_len: [128], max_num_seqs: [8], max_num_batched_tokens: [64], tensor_parallel_size: [{tp}]}}}}]
""")
    assert [e.tensor_parallel_size for e in matrix.entries] == [tp]


@pytest.mark.parametrize("gke_name, matrix_name", [("tpu7x-8", "v7x-8"), ("v5litepod-4", "v5e-4"),
                                                   ("v6e-8", "v6e-8"), ("v5p-8", "v5p-8")])
def test_a_host_without_a_tpu_hands_the_stack_gkes_name_for_the_entrys_accelerator(gke_name, matrix_name):
    """tpu-inference reads its cores per chip from TPU_ACCELERATOR_TYPE's Cloud prefix (tpu_info.get_num_cores_per_chip:
    v5litepod and v6e have one): the env aotc gives it on a host without a TPU names the slice as GKE does."""
    from aotc.runners.tpu_inference.engine import host_without_tpu_env

    entry = replace(tpu_entry(matrix_name), runner="tpu-inference")
    assert host_without_tpu_env(entry, "aotc")["TPU_ACCELERATOR_TYPE"] == gke_name
