"""The guard's watcher for vLLM-TPU on tpu-inference (JAX) (``RunnerSpec.watcher``; see aotc/guard.py).

JAX reports every compilation through ``jax.monitoring``: ``/jax/compilation_cache/compile_requests_use_cache``
and ``/jax/compilation_cache/cache_hits`` while the persistent cache is looked up (jax/_src/compiler.py
``compile_or_get_cached``), then ``/jax/core/compile/backend_compile_duration`` with ``fun_name`` when the
executable exists, loaded or compiled (jax/_src/interpreters/pxla.py ``_cached_compilation``). A duration
event with no hit before it in the same thread is a real compile. The compiled function's argument shapes
come from the StableHLO module handed to ``compiler.compile_or_get_cached`` (read only for a compile after
ready). Listeners go in when vLLM imports tpu-inference's worker, i.e. in the engine-core process only.

After each ``execute_model`` / ``sample_tokens`` of tpu-inference's ``TPUWorker``, compiles since the last
step are reported with the step's padded shape (tpu-inference's own padding functions) and the graph
families the manifest lacks for it.
"""

from __future__ import annotations

import threading
from typing import Any

from aotc.runners.watching import (StepCompiles, StepWatcher, patch_steps, scheduled_request_ids, uncovered_families,
                        when_imported)

from aotc.runners.twin_flag import on_the_twin

WORKER_MODULE = "tpu_inference.worker.tpu_worker"
REQUESTS_EVENT = "/jax/compilation_cache/compile_requests_use_cache"
HIT_EVENT = "/jax/compilation_cache/cache_hits"
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # jax._src.dispatch.BACKEND_COMPILE_EVENT

# Families a step runs and the step fields that pick their bucket (buckets.capture_plan's shapes).
STEP_FAMILIES: dict[str, tuple[str, ...]] = {
    "backbone": ("num_tokens",),
    "select_from_array": ("array_size", "index_size"),
    "compute_logits": ("num_reqs",),
    "sample": ("num_reqs",),
}


class JaxCompiles:
    """Process-wide tallies from JAX's monitoring events (one listener set per process)."""

    def __init__(self) -> None:
        self.requests = self.hits = self.compiles = 0
        self.compiled: list[str] = []  # "fun_name(arg types)" of compiles not yet taken
        self.keep_names = False  # naming costs a module walk: only after ready
        self._local = threading.local()
        self._lock = threading.Lock()

    def install(self) -> None:
        from jax import monitoring
        from jax._src import compiler

        monitoring.register_event_listener(self.on_event)
        monitoring.register_event_duration_secs_listener(self.on_duration)
        compile_or_get_cached = compiler.compile_or_get_cached

        def remembering(backend, computation, *args, **kwargs):
            self._local.computation = computation
            return compile_or_get_cached(backend, computation, *args, **kwargs)

        compiler.compile_or_get_cached = remembering  # pxla looks it up on the module at call time

    def on_event(self, event: str, **_kwargs) -> None:
        if event == REQUESTS_EVENT:
            with self._lock:
                self.requests += 1
        elif event == HIT_EVENT:
            self._local.hit = True
            with self._lock:
                self.hits += 1

    def on_duration(self, event: str, _duration: float, fun_name: str = "?", **_kwargs) -> None:
        if event != BACKEND_COMPILE_EVENT:
            return
        loaded = getattr(self._local, "hit", False)
        computation = getattr(self._local, "computation", None)
        self._local.hit, self._local.computation = False, None
        if loaded:
            return
        name = f"{fun_name}({argument_types(computation)})" if self.keep_names else fun_name
        with self._lock:
            self.compiles += 1
            if self.keep_names:
                self.compiled.append(name)

    def counters(self) -> dict[str, int]:
        with self._lock:
            return {"compiles": self.compiles, "hits": self.hits, "misses": self.requests - self.hits}

    def take_names(self) -> tuple[str, ...]:
        with self._lock:
            names, self.compiled = tuple(self.compiled), []
        return names


def argument_types(computation: Any) -> str:
    """The main function's argument types of a StableHLO module, e.g. ``tensor<16xi32>, tensor<2xui32>``."""
    try:
        with computation.context:
            for op in computation.body.operations:
                if "sym_name" in op.attributes and op.attributes["sym_name"].value == "main":
                    return ", ".join(str(t) for t in op.type.inputs)
    except Exception:  # a report, never a failure: the name alone still identifies the graph
        pass
    return "?"


def step_shape(runner: Any, scheduled: Any) -> dict[str, Any]:
    """The step's padded shape by tpu-inference's own padding functions (only when something compiled)."""
    from tpu_inference.runner import utils

    reqs = len(scheduled.num_scheduled_tokens) if scheduled is not None else 0
    tokens = scheduled.total_num_scheduled_tokens if scheduled is not None else 0
    num_tokens = utils.get_padded_token_len(runner.num_tokens_paddings, max(tokens, 1))
    num_reqs = utils.get_padded_num_reqs_with_upper_limit(max(reqs, 1), runner.max_num_reqs)
    return {"num_tokens": num_tokens, "num_reqs": num_reqs, "array_size": num_tokens, "index_size": num_reqs,
            "scheduled_reqs": reqs, "scheduled_tokens": tokens}


def explain(graphs: tuple | None, step: dict[str, Any]) -> tuple[str, str]:
    """(metrics family label, why) for a step that compiled."""
    if graphs is None:
        return "unplanned", "graph family unknown (no manifest)"
    missing = uncovered_families(graphs, step, STEP_FAMILIES)
    if missing:
        return missing[0].split("[")[0], f"the manifest lacks {', '.join(missing)}"
    return "unplanned", ("every family's bucket for this step is in the manifest: a graph outside tpu-inference's "
                         "capture_model, or a cache entry the fetched artifact lacks")


class Watcher(StepWatcher):
    """Built by the guard with the process's session; hooks JAX and tpu-inference's worker on its import."""

    # JAX's cache key hashes the engine core's XLA_FLAGS / LIBTPU_INIT_ARGS as they are when it compiles:
    # tpu-inference's own flags as the twin plugin left them after its env_override ran here.
    live_flags = True

    def __init__(self, session: Any):
        self.jax = JaxCompiles()
        super().__init__(session, self.jax.counters)
        self.device = "cpu" if on_the_twin() else "tpu"
        when_imported(WORKER_MODULE, self.patch)

    def patch(self, module: Any) -> None:
        self.jax.install()
        patch_steps(module.TPUWorker, self.on_step)

    def ready(self) -> None:
        super().ready()
        self.jax.keep_names = True

    def compiles_in(self, counts: dict[str, int]) -> int:
        return counts.get("compiles", 0)

    def describe(self, worker: Any, what: str, scheduled: Any, new: dict[str, int], compiles: int) -> StepCompiles:
        step = step_shape(worker.model_runner, scheduled)
        family, why = explain(self.session.graphs, step)
        return StepCompiles(what, compiles, new, step, family, why, functions=self.jax.take_names(),
                            request_ids=scheduled_request_ids(scheduled))
