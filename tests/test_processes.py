"""aotc/processes.py with real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tests.conftest import REPO

LEAVER = """
import multiprocessing, sys, time
from aotc.processes import exit_now
def idle():
    time.sleep(600)
if __name__ == "__main__":
    child = multiprocessing.get_context("fork").Process(target=idle, daemon=True)
    child.start()
    print(child.pid, flush=True)
    exit_now(0)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_exit_now_leaves_no_multiprocessing_child_behind(tmp_path):
    """A runner leaves through exit_now (no interpreter teardown); a child multiprocessing started, as
    tpu-inference's DP scheduler starts its workers, must not outlive it."""
    script = tmp_path / "leaver.py"
    script.write_text(LEAVER)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    child = int(proc.stdout.split()[0])
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child)
