"""aotc/processes.py with real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

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


STACK_ENTRY_POINTS = {
    # each entry point is called on input it refuses: what is asserted is the collector's pace it leaves set
    "runner": "from aotc.runners.protocol import runner_main\n"
              "runner_main('python -m runner', None, ['build', '/no/such/request.json', '/no/result.json'])",
    "kv sizing": "import io\nsys.stdin = io.StringIO('not an entry')\n"
                 "from aotc.runners.kv_sizing import main\nmain(lambda entry: 1)",
}


@pytest.mark.parametrize("entry_point", sorted(STACK_ENTRY_POINTS))
def test_a_process_that_imports_a_stack_collects_garbage_rarely(entry_point):
    """aotc's processes that import torch, vLLM or JAX raise the young generation's threshold before they do
    (aotc/processes.py: STACK_PROCESS_GC_THRESHOLD), in a process of their own."""
    from aotc.processes import STACK_PROCESS_GC_THRESHOLD

    script = f"import gc, sys\nassert gc.get_threshold() != {STACK_PROCESS_GC_THRESHOLD!r}\n" \
             f"{STACK_ENTRY_POINTS[entry_point]}\nprint(list(gc.get_threshold()), file=sys.__stdout__)"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == str(list(STACK_PROCESS_GC_THRESHOLD))
