"""CLI contract: usage errors are one line with exit 2, --json is one document on stdout."""

import argparse
import json

import pytest

from aotc.cli import build_parser
from aotc.runners.tpu_inference.topology import SINGLE_HOST_SLICES, topology_for

from .conftest import CONFIGS, run_aotc
from .helpers.cli import one_line_error


@pytest.mark.parametrize("args", [["frobnicate"], ["plan"], ["build", str(CONFIGS / "demo.yaml"), "--jobs", "x"],
                                  ["fetch", "--dest", "/tmp/x"], ["build", str(CONFIGS / "demo.yaml"), "--jobs", "0"],
                                  ["build", str(CONFIGS / "demo.yaml"), "--shard", "2/2"],
                                  ["build", str(CONFIGS / "demo.yaml"), "--precompile-workers", "0"],
                                  ["verify", "/nonexistent-artifact"]])
def test_usage_errors_exit_2_with_one_line(args):
    line = one_line_error(run_aotc(*args), 2)
    assert line.startswith("aotc: error: ") and not line.startswith("aotc: error: aotc"), line  # the prefix once


def test_bare_aotc_prints_the_command_list_and_exits_2():
    proc = run_aotc()
    assert proc.returncode == 2 and not proc.stdout and "error" not in proc.stderr, proc.stderr
    [commands] = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    listed = " ".join(proc.stderr.split())  # argparse wraps long help lines
    for command in commands._choices_actions:
        assert f"{command.dest} {' '.join(command.help.split())}" in listed, command.dest


def test_plan_json_is_one_document_and_logs_stay_off_stdout():
    proc = run_aotc("plan", CONFIGS / "demo.yaml", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["entries"][0]["entry"] == "tiny-llama--len128-seqs8-tok64-tp1"


def test_debug_env_shows_traceback():
    proc = run_aotc("plan", "/nonexistent.yaml", env={"AOTC_DEBUG": "1"})
    assert proc.returncode != 0 and "Traceback" in proc.stderr


@pytest.mark.slow
@pytest.mark.needs_jax
def test_doctor_reports_versions_and_an_honest_loadability_probe():
    proc = run_aotc("doctor", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["runners"]["vllm-tpu"]["versions"]["torch_xla"] == "2.9.0"
    assert doc["runners"]["tpu-inference"]["versions"]["jax"]  # read from the JAX venv's metadata
    probe = doc["loadability"]
    assert probe["written"] and probe["found"]
    # torch_xla 2.9.0 cannot deserialize its own cache (pytorch/xla#9094): the probe must say so
    assert probe["loadable"] is False
    assert probe["second_process"]["PersistentCacheDeserializeFailure"] >= 1
    # the TPU topologies the JAX stack compiles for here, with no TPU: each as libtpu resolved it
    targets = {t["accelerator"]: t for t in doc["tpu_targets"]["tpu-inference"]}
    assert set(targets) == set(SINGLE_HOST_SLICES) and not [t for t in targets.values() if "error" in t]
    assert targets["v6e-8"]["topology"] == topology_for("v6e-8").name and targets["v6e-8"]["devices"] == 8
    assert targets["v6e-8"]["device_kind"] == "TPU v6 lite" and "vllm-tpu" not in doc["tpu_targets"]
