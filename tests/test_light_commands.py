"""The light commands never import torch or vLLM: a pod's init container starts them in well under a second."""

import json
import subprocess
import sys

from .conftest import CONFIGS

HEAVY = ("torch", "torch_xla", "vllm", "jax", "transformers")


def modules_after(code: str) -> set[str]:
    probe = code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out.strip().splitlines()[-1]))


def test_plan_and_fingerprint_import_no_heavy_package():
    code = f"""
import contextlib, io
import aotc.cli
with contextlib.redirect_stdout(io.StringIO()):
    assert aotc.cli.main(["plan", "{CONFIGS / 'example-tpu.yaml'}"]) == 0
    assert aotc.cli.main(["plan", "{CONFIGS / 'example-tpu.yaml'}", "--json"]) == 0
    assert aotc.cli.main(["fingerprint", "{CONFIGS / 'example-tpu.yaml'}", "--entry",
                          "llama31-8b--len2048-seqs128-tok512-tp1"]) == 0
"""
    loaded = modules_after(code)
    assert not [m for m in HEAVY if m in loaded]


def test_store_commands_import_no_heavy_package():
    code = """
import aotc.cli, aotc.store, aotc.publish, aotc.fetch
"""
    loaded = modules_after(code)
    assert not [m for m in HEAVY if m in loaded]
