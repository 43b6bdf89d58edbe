"""Small process helpers every layer shares: a free loopback port, an environment change where None unsets,
leaving without interpreter teardown, SIGTERM as an exception, and the garbage collector's pace in a process
that imports a stack."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator, Mapping, MutableMapping


def free_port() -> int:
    """A loopback port the kernel picks at random (tests, the canary, the loopback GCS; pods use their own)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def update_env(target: MutableMapping[str, str], changes: Mapping[str, str | None]) -> None:
    """Apply ``changes`` to an environment (``os.environ`` or a copy): a value sets, None unsets."""
    for key, value in changes.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = value


# The young generation's threshold in a process of aotc's that imports a stack (torch, vLLM, JAX: about 8,000
# modules, objects that live as long as the process) and then traces and compiles: at the interpreter's default
# (700 allocations) the cyclic collector runs thousands of times over them (what it saves: docs/testing.md).
# The collector still runs; a runner lives for minutes, not a server's days.
STACK_PROCESS_GC_THRESHOLD = (100_000, 50, 100)


def collect_garbage_rarely() -> None:
    """Call first in a process entry point that imports a stack (a runner, a KV sizing). Not in the engine-argument
    check (aotc/runners/serve_args.py): its answers are kept keyed by its source, and most runs read them."""
    gc.set_threshold(*STACK_PROCESS_GC_THRESHOLD)


def exit_now(code: int) -> None:
    """Leave without interpreter teardown, output flushed: an in-process vLLM engine or a stalled transfer
    thread can hang there, and the result is already written. Child processes multiprocessing started (e.g.
    tpu-inference's DP scheduler workers at data parallel > 1) are killed first: the teardown that would have
    stopped them is skipped, and each would stay behind holding its copy of the engine's memory."""
    sys.stdout.flush()
    sys.stderr.flush()
    if "multiprocessing" in sys.modules:
        for child in sys.modules["multiprocessing"].active_children():
            child.kill()
    os._exit(code)


class Terminated(KeyboardInterrupt):
    """SIGTERM (a pod deleted, a job cancelled) raised where the main thread is, as Ctrl-C raises
    KeyboardInterrupt: every ``finally`` and ``with`` on the way out runs, so nothing half-written stays."""


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Inside, SIGTERM raises ``Terminated`` once; a second one is ignored, so it cannot cut the clean-up
    the first started (the kubelet's SIGKILL after the grace period still ends the process). The previous
    handler is back afterwards (``aotc.cli.main`` also runs inside test processes); off the main thread,
    where Python cannot take signals, nothing changes."""
    def terminated(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated()

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def interrupted_exit_code(exc: KeyboardInterrupt) -> int:
    """The shell's convention: 128 + the signal's number (SIGTERM 143, SIGINT 130)."""
    return 128 + (signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)
