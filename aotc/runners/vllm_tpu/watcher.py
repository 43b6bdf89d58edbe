"""The guard's watcher for vLLM 0.13's torch_xla TPU worker (``RunnerSpec.watcher``; see aotc/guard.py).

After each ``execute_model`` / ``sample_tokens`` it reads three counters (C++/dict reads that never wait
for the device): torch_xla's ``UncachedCompile`` and ``PersistentCacheMiss`` and dynamo's unique graphs.
What grew during a step after ready is reported with the step's padded shape and the graph families the
manifest lacks for it. Importing this module imports neither torch nor vLLM: the worker is patched when
vLLM imports it, in the process that does (the engine core).
"""

from __future__ import annotations

from typing import Any

from aotc.runners.watching import (StepCompiles, StepWatcher, patch_steps, scheduled_request_ids, uncovered_families,
                        when_imported)

from aotc.runners.twin_flag import on_the_twin

TPU_WORKER_MODULE = "vllm.v1.worker.tpu_worker"
XLA_COUNTERS = ("UncachedCompile", "PersistentCacheMiss", "PersistentCacheHit")
COMPILE_COUNTER = "UncachedCompile"
DYNAMO_GRAPHS = "DynamoGraphs"

# Which shape fields of a step decide each graph family sample_tokens runs (vllm 0.13 TPUModelRunner).
STEP_FAMILIES: dict[str, tuple[str, ...]] = {
    "backbone": ("num_tokens",),
    "select_hidden_states": ("num_tokens", "num_reqs"),
    "compute_logits": ("num_reqs",),
    "sample_from_logits": ("num_reqs", "all_greedy"),
    "gather_logprobs": ("num_reqs",),
}

RESTORED_BY_DYNAMO = ("UncachedCompile",)
_banked: dict[str, int] = {}


def bank_across_clears(met: Any) -> None:
    """Keep counts torch_xla's dynamo bridge erases.

    While it compiles a new graph the bridge calls ``metrics.clear_counters()`` for every FX node and
    puts back only UncachedCompile, so a PersistentCacheMiss would vanish before the step ends. Wrap
    the module function once per process (it chains with any other wrapper, e.g. the build probe's).
    """
    original = met.clear_counters
    if getattr(original, "_aotc_guard_banks", False):
        return

    def clear_and_bank():
        for name in XLA_COUNTERS:
            if name not in RESTORED_BY_DYNAMO:
                _banked[name] = _banked.get(name, 0) + (met.counter_value(name) or 0)
        return original()

    clear_and_bank._aotc_guard_banks = True  # type: ignore[attr-defined]
    met.clear_counters = clear_and_bank


def read_counters() -> dict[str, int]:
    """Process-wide counters; C++/dict reads that never wait for the device."""
    import torch._dynamo.utils as dynamo_utils
    import torch_xla.debug.metrics as met

    values = {name: (met.counter_value(name) or 0) + _banked.get(name, 0) for name in XLA_COUNTERS}
    values[DYNAMO_GRAPHS] = dynamo_utils.counters["stats"]["unique_graphs"]
    return values


def step_families(step: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    return {f: keys for f, keys in STEP_FAMILIES.items() if f != "gather_logprobs" or step.get("logprobs")}


def explain(graphs: tuple | None, what: str, new: dict[str, int], step: dict[str, Any]) -> tuple[str, str]:
    """(metrics family label, why) for a step that compiled."""
    if graphs is None:
        return "unplanned", "graph family unknown (no manifest)"
    if not new.get("PersistentCacheMiss"):
        return "cached", ("the persistent cache holds this graph but it compiled anyway (torch_xla 2.9 cannot "
                          "load cache entries, pytorch/xla#9094)")
    missing = uncovered_families(graphs, step, step_families(step)) if what == "sample_tokens" else []
    if missing:
        return missing[0].split("[")[0], f"not in the cache; the manifest lacks {', '.join(missing)}"
    return "unplanned", "not in the cache; every family's bucket is in the manifest: a variant capture_model does not trace"


def step_shape(runner: Any, scheduled: Any) -> dict[str, Any]:
    """The step's padded shape, computed only when a compile was seen (never on the hot path)."""
    from vllm.v1.worker import tpu_model_runner as tmr

    batch = runner.input_batch
    reqs = len(scheduled.num_scheduled_tokens) if scheduled is not None else batch.num_reqs
    tokens = scheduled.total_num_scheduled_tokens if scheduled is not None else 0
    return {
        "num_reqs": tmr._get_padded_num_reqs_with_upper_limit(max(reqs, 1), runner.max_num_reqs),
        "num_tokens": tmr._get_padded_token_len(runner.num_tokens_paddings, max(tokens, 1)),
        "all_greedy": bool(batch.all_greedy),
        "sampling": "greedy" if batch.all_greedy else "random" if batch.all_random else "greedy+random",
        "logprobs": bool(batch.max_num_logprobs),
        "scheduled_reqs": reqs, "scheduled_tokens": tokens,
    }


class Watcher(StepWatcher):
    """Built by the guard with the process's session; hooks TPUWorker when vLLM imports it."""

    # The fingerprint has the pod's launch flags: torch_xla and TPUWorker append theirs later, as in a build.
    live_flags = False
    hits_counter = "PersistentCacheHit"
    misses_counter = "PersistentCacheMiss"

    def __init__(self, session: Any, counters=read_counters):
        super().__init__(session, counters)
        self.device = "cpu" if on_the_twin() else "tpu"
        when_imported(TPU_WORKER_MODULE, self.patch)

    def patch(self, module: Any) -> None:
        import torch_xla.debug.metrics as met

        bank_across_clears(met)
        patch_steps(module.TPUWorker, self.on_step)

    def compiles_in(self, counts: dict[str, int]) -> int:
        return max(counts.get(k, 0) for k in (COMPILE_COUNTER, "PersistentCacheMiss", DYNAMO_GRAPHS))

    def describe(self, worker: Any, what: str, scheduled: Any, new: dict[str, int], compiles: int) -> StepCompiles:
        step = step_shape(worker.model_runner, scheduled)
        family, why = explain(self.session.graphs, what, new, step)
        evidence = {k: v for k, v in new.items() if k != self.hits_counter}
        return StepCompiles(what, compiles, evidence, step, family, why, request_ids=scheduled_request_ids(scheduled))
