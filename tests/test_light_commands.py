"""The light commands (plan, fingerprint, publish, ls, fetch — what a pod's init container and a CI job run)
never import torch, torch_xla, vLLM, JAX or transformers: each runs for real in a fresh interpreter and the
modules it loaded are listed. (How fast they start is a benchmark's business, not a pass/fail test's.)"""

import json
import subprocess
import sys

from .conftest import CONFIGS
from aotc.testing.artifacts import make_artifact

HEAVY = ("torch", "torch_xla", "vllm", "jax", "transformers")


def modules_after(code: str) -> set[str]:
    probe = code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out.strip().splitlines()[-1]))


def heavy_after(*commands: list[str]) -> list[str]:
    """Run each ``aotc`` command through the real CLI in one fresh interpreter; the heavy modules it loaded."""
    code = f"""
import contextlib, io
import aotc.cli
for argv in {[list(map(str, c)) for c in commands]!r}:
    with contextlib.redirect_stdout(io.StringIO()):
        assert aotc.cli.main(argv) == 0, argv
"""
    loaded = modules_after(code)
    return [m for m in HEAVY if m in loaded]


def test_plan_and_fingerprint_import_no_heavy_package():
    example = CONFIGS / "example-tpu.yaml"
    # the demo's KV block count is its stack's sizing: in a process of its own (kept on disk), never this one
    demo = CONFIGS / "demo.yaml"
    assert heavy_after(["plan", example], ["plan", example, "--json"],
                       ["fingerprint", demo, "--entry", "tiny-llama--len128-seqs8-tok64-tp1"]) == []


def test_publish_ls_and_fetch_import_no_heavy_package(tmp_path):
    artifact = make_artifact(tmp_path / "artifacts")
    fingerprint = json.loads((artifact / "manifest.json").read_text())["fingerprint"]
    store = f"file://{tmp_path / 'store'}"
    dest = tmp_path / "dest"
    assert heavy_after(["publish", artifact, "--store", store], ["ls", "--store", store],
                       ["fetch", "--fingerprint", fingerprint, "--dest", dest, "--store", store]) == []
    assert (dest / "manifest.json").is_file()  # the fetch really ran
