"""Forks publisher processes on request, so crash and race tests pay gcsfs' ~3 s import once.

Run as ``python -m tests.helpers.publisher_zygote``; it reads one JSON job list per stdin line, forks one
child per job (a real process: SIGKILL is SIGKILL), and answers one JSON line with each child's
exit status (negative: killed by that signal). A job:

  {"url": ..., "dirs": [...], "result": path for the child's JSON result, "start_at": epoch or null,
   "kill": {"op": K, "mode": "before" | "during" | "mid", "delay": seconds} or null}

``kill`` counts the store's write operations (put_object, create, replace, delete) and SIGKILLs the child
before the K-th, a few ms into it ("during", the request is in flight), or halfway through copying an
object's bytes ("mid", folder stores).
"""

from __future__ import annotations

import os

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import json
import signal
import sys
import threading
import time
from typing import Any

# Imported once, before forking (fsspec resets its event loop in each child). gcsfs imports its
# gRPC extension lazily at the first upload: another 0.6 s per child unless done here.
import gcsfs  # noqa: F401
import gcsfs.extended_gcsfs  # noqa: F401

from aotc.publish import publish_artifacts
from aotc.store import Store

WRITE_OPS = ("put_object", "create", "replace", "delete")


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _arm(kill: dict[str, Any]) -> None:
    counter = {"n": 0}
    target, mode, delay = kill["op"], kill.get("mode", "before"), kill.get("delay", 0.002)

    def wrap(name: str):
        original = getattr(Store, name)

        def op(self: Store, *args: Any, **kwargs: Any) -> Any:
            counter["n"] += 1
            if counter["n"] == target:
                if mode == "before":
                    _die()
                elif mode == "during":
                    threading.Timer(delay, _die).start()
                elif mode == "mid" and name == "put_object":
                    _half_copy_then_die(self, *args)
            return original(self, *args, **kwargs)

        setattr(Store, name, op)

    for name in WRITE_OPS:
        wrap(name)


def _half_copy_then_die(store: Store, lpath: str, sha: str) -> None:
    """Let the backend start writing the object, then die with half its bytes written."""
    fs = store.fs

    def half(src: str, dst: str, *a: Any, **k: Any) -> None:
        with open(src, "rb") as f:
            data = f.read()
        with fs.open(dst, "wb") as out:
            out.write(data[: len(data) // 2])
            out.flush()
            _die()

    fs.put_file = half


def _child(job: dict[str, Any]) -> None:
    if job.get("kill"):
        _arm(job["kill"])
    if job.get("start_at"):
        time.sleep(max(0.0, job["start_at"] - time.time()))
    try:
        results = publish_artifacts(job["dirs"], job["url"])
        payload: Any = [r.to_dict() for r in results]
        code = 0
    except Exception as exc:  # reported to the test, which decides
        payload, code = {"error": f"{type(exc).__name__}: {exc}"}, 1
    with open(job["result"], "w") as f:
        json.dump(payload, f)
    os._exit(code)


def main() -> None:
    print("READY", flush=True)
    for line in sys.stdin:
        jobs = json.loads(line)
        pids = []
        for job in jobs:
            pid = os.fork()
            if pid == 0:
                try:
                    _child(job)
                finally:
                    os._exit(70)
            pids.append(pid)
        statuses = []
        for pid in pids:
            _, status = os.waitpid(pid, 0)
            statuses.append(-os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
        print(json.dumps(statuses), flush=True)


if __name__ == "__main__":
    main()
