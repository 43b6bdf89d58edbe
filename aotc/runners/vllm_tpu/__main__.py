"""python -m aotc.runners.vllm_tpu {build|verify} REQUEST.json RESULT.json

The shared protocol (aotc/runners/protocol.py) plus this runner's stderr capture: the PJRT client's
"Failed to deserialize" lines are evidence verify counts.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from contextlib import contextmanager

from aotc.entry import Entry
from aotc.processes import exit_now
from aotc.runners.protocol import BuildResult, Mode, Request, VerifyResult, runner_main

from .probe import STDERR_LOG_ENV


@contextmanager
def stderr_to_file():
    """Send fd 2 to a file the probe can scan, echoing it to the real stderr.

    The PJRT client's "Failed to deserialize" warnings come from C++ straight
    to fd 2, so Python-level capture would not see them.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    fd, path = tempfile.mkstemp(prefix="aotc-runner-stderr-", suffix=".log")
    os.dup2(fd, 2)
    os.close(fd)
    stop = threading.Event()
    echo = threading.Thread(target=_echo, args=(path, saved, stop), daemon=True)
    echo.start()
    try:
        yield path
    finally:
        sys.stderr.flush()
        stop.set()
        echo.join()
        os.dup2(saved, 2)
        os.close(saved)
        os.unlink(path)


def _echo(path: str, out_fd: int, stop: threading.Event) -> None:
    with open(path, "rb") as fh:
        while True:
            done = stop.is_set()
            chunk = fh.read()
            if chunk:
                os.write(out_fd, chunk)
            if done:
                return
            stop.wait(0.2)


def run(mode: Mode, request: Request) -> BuildResult | VerifyResult:
    with stderr_to_file() as log_path:
        os.environ[STDERR_LOG_ENV] = log_path
        if mode == "build":
            from .build import run_build

            return run_build(request)
        from .verify import run_verify

        return run_verify(request)


def check_entry(entry: Entry) -> None:
    from .engine import check_entry as check

    check(entry)


if __name__ == "__main__":
    # vLLM's in-process engine can hang in interpreter teardown; the result is already on disk
    exit_now(runner_main("python -m aotc.runners.vllm_tpu", run, check=check_entry))
