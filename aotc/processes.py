"""Small process helpers every layer shares: a free loopback port, an environment change where None unsets,
leaving without interpreter teardown, and SIGTERM as an exception."""

from __future__ import annotations

import contextlib
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
