"""The node ids docs/support.md's generated table stands for (tests/support_cases.py) are the ones pytest
collects, parametrization ids included: collecting the tpu-inference modules needs the JAX venv, so this lives
here while tests/test_support_table.py checks the rest on the core venv alone."""

from __future__ import annotations

import subprocess
import sys

from tests.support_cases import REPO, SUITES
from tests.support_table import node_ids


def test_every_evidence_node_id_is_collected_by_pytest(jax_env):
    """The node ids the table's cells stand for are the ones pytest collects, parametrization ids included."""
    modules = sorted({check.module for suite in SUITES for check in (suite.build, suite.verify, suite.canary) if check})
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "",
                           *modules], capture_output=True, text=True, cwd=REPO, timeout=900, env=jax_env)
    assert proc.returncode == 0, proc.stdout[-3000:]
    collected = set(proc.stdout.splitlines())
    assert set(node_ids()) <= collected, sorted(set(node_ids()) - collected)
