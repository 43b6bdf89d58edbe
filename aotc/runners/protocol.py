"""The runner subprocess protocol, backend-neutral: `python -m <runner> {build|verify} REQUEST.json RESULT.json`.

The core (aotc/build.py: run_runner) writes REQUEST.json — {"entry": Entry.to_dict(), "plan": [GraphSpec
dicts], "cache_dir": ..., "traffic": N, "seed": S} — and reads RESULT.json; an "error" key means the
check failed. Exit 0 ok, 1 a check failed (RESULT.json carries "error"), 2 bad usage or request.
One entry per process: the compiler runtimes are process-global and cannot be reset between entries.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

REQUIRED = {"entry", "plan", "cache_dir"}
ENTRY_REQUIRED = {"model", "device", "accelerator", "dtype", "max_model_len", "max_num_seqs",
                  "max_num_batched_tokens", "tensor_parallel_size"}
DEVICES = ("cpu", "tpu")


def load_request(path: str, mode: str) -> dict[str, Any]:
    with open(path) as fh:
        request = json.load(fh)
    missing = REQUIRED - set(request) or ENTRY_REQUIRED - set(request.get("entry", {}))
    if missing:
        raise ValueError(f"missing {sorted(missing)}")
    if request["entry"]["device"] not in DEVICES:
        raise ValueError(f"unknown device {request['entry']['device']!r}")
    if mode == "verify" and not os.path.isdir(request["cache_dir"]):
        raise ValueError(f"no cache at {request['cache_dir']}")
    return request


def serve(prog: str, run: Callable[[str, dict[str, Any]], dict[str, Any]], argv: list[str] | None = None,
          check: Callable[[dict[str, Any]], None] | None = None) -> int:
    """Parse argv, validate the request (``check`` adds the runner's own rules; ValueError → exit 2), run it
    and always leave a RESULT.json."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("mode", choices=["build", "verify"])
    parser.add_argument("request")
    parser.add_argument("result")
    args = parser.parse_args(argv)
    try:
        request = load_request(args.request, args.mode)
        if check:
            check(request["entry"])
    except (OSError, ValueError) as exc:
        print(f"bad request {args.request}: {exc}", file=sys.stderr)
        return 2
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


def exit_now(code: int) -> None:
    """Leave without interpreter teardown: an in-process vLLM engine can hang there; the result is on disk."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
