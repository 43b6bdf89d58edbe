"""tpu-inference's parallel precompile (NUM_PRECOMPILE_WORKERS > 1) compiles on a thread pool after the
call that submitted the compile has returned: the probe still ties the compile's evidence to that call.
A stand-in for CompilationManager (its pool and queue only) drives the real instrument and probe code."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

from aotc.runners.tpu_inference.instrument import _measured_compilation
from aotc.runners.tpu_inference.probe import Probe

WRITE = "/jax/compilation_cache/cache_misses"


def test_pooled_compiles_land_in_the_submitting_calls_window():
    probe = Probe()
    release = threading.Event()
    manager = SimpleNamespace(_compile_executor=ThreadPoolExecutor(max_workers=2), _warmup_tasks=[], futures=[])

    def compile_later(key):
        release.wait(5)  # runs after the call's window has closed
        probe._on_event(WRITE)
        probe._thread.window.written.append(key)

    def run_compilation(self, name, fn, *args, **kwargs):  # what CompilationManager does with a pool
        self.futures.append(self._compile_executor.submit(compile_later, f"{name}-{kwargs['num_reqs']}"))

    measured = _measured_compilation(probe, run_compilation)
    for reqs in (8, 16):
        measured(manager, "sample", None, num_reqs=reqs)
    probe._on_event("/jax/compilation_cache/compile_requests_use_cache")  # the main thread's stays outside
    release.set()
    for future in manager.futures:
        future.result()
    calls = [r for r in probe.snapshot() if r.kind == "call"]
    assert [(c.shape["num_reqs"], c.counts.writes, c.written) for c in calls] == [
        (8, 1, ("sample-8",)), (16, 1, ("sample-16",))]
    phase = [r for r in probe.snapshot() if r.kind == "phase"]
    assert (phase[0].counts.requests, phase[0].counts.writes) == (1, 0)
