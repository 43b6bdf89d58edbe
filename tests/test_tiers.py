"""`make test-fast` on a clone without the JAX venv: the tier the Makefile runs collects without touching it
(the tests it then runs need only the core venv: each that needs the JAX venv is marked `needs_jax`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from .conftest import REPO


def test_fast_tier_of_the_makefile_collects_without_the_jax_venv(tmp_path):
    recipe = re.search(r"^test-fast:.*\n\t(.*)$", (REPO / "Makefile").read_text(), re.M).group(1)
    markexpr = re.search(r'-m "([^"]*)"', recipe).group(1)
    no_venv = {**os.environ, "AOTC_PYTHON_TPU_INFERENCE": str(tmp_path / "no-jax-venv" / "bin" / "python")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", markexpr, "--collect-only", "-q",
                           "-p", "no:cacheprovider"], capture_output=True, text=True, env=no_venv, cwd=REPO,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:]
    collected = [line for line in proc.stdout.splitlines() if "::" in line]
    assert collected and not [t for t in collected if t.startswith("tests/tpu_inference/")]
