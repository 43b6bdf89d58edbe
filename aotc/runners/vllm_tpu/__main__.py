"""python -m aotc.runners.vllm_tpu {build|verify} REQUEST.json RESULT.json

One entry per process (the core spawns us): vLLM, torch_xla and the XLA
runtime are process-global and cannot be reset between entries.
Exit 0 ok, 1 a check failed (RESULT.json carries "error"), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import traceback
from contextlib import contextmanager

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


REQUIRED = {"entry", "plan", "cache_dir"}
ENTRY_REQUIRED = {"model", "device", "accelerator", "dtype", "max_model_len", "max_num_seqs",
                  "max_num_batched_tokens", "tensor_parallel_size"}


def load_request(path: str, mode: str) -> dict:
    with open(path) as fh:
        request = json.load(fh)
    missing = REQUIRED - set(request) or ENTRY_REQUIRED - set(request.get("entry", {}))
    if missing:
        raise ValueError(f"missing {sorted(missing)}")
    from .engine import check_entry

    check_entry(request["entry"])
    if mode == "verify" and not os.path.isdir(request["cache_dir"]):
        raise ValueError(f"no cache at {request['cache_dir']}")
    return request


def run(mode: str, request: dict) -> dict:
    if mode == "build":
        from .build import run_build

        return run_build(request)
    from .verify import run_verify

    return run_verify(request)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aotc.runners.vllm_tpu")
    parser.add_argument("mode", choices=["build", "verify"])
    parser.add_argument("request")
    parser.add_argument("result")
    args = parser.parse_args(argv)
    try:
        request = load_request(args.request, args.mode)
    except (OSError, ValueError) as exc:
        print(f"bad request {args.request}: {exc}", file=sys.stderr)
        return 2

    with stderr_to_file() as log_path:
        os.environ[STDERR_LOG_ENV] = log_path
        try:
            result = run(args.mode, request)
        except Exception as exc:  # the core needs a RESULT.json whatever happened
            traceback.print_exc()
            result = {"error": f"{type(exc).__name__}: {exc}"}
    with open(args.result, "w") as fh:
        json.dump(result, fh, indent=2, sort_keys=True)
    if result.get("error"):
        print(f"aotc runner {args.mode} failed: {result['error']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # vLLM's in-process engine can hang in interpreter teardown; the result is
    # already on disk.
    os._exit(code)
