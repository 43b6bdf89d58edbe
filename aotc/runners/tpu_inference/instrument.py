"""Ties tpu-inference's own compiles to the plan: every `CompilationManager._run_compilation` (and the
warm-up call it queues) runs inside a probe window named by family and shape; every runtime step
inside a window with the step's scheduled shape.

Class-level patches on the in-process engine: nothing tpu-inference does changes, only what is
recorded around it.
"""

from __future__ import annotations

import contextlib
import functools
import re
import time
from typing import Any

from aotc.runners.protocol import FamilyProgress

from .probe import Probe

# `_run_compilation` names (rank prefix "worker<N> " removed) -> the plan's families.
FAMILY_OF_NAME = {
    "sample": "sample",
    "gather_logprobs": "gather_logprobs",
    "compute_and_gather_prompt_logprobs": "gather_prompt_logprobs",
    "backbone": "backbone",
    "backbone with embeds": "backbone_with_embeds",
    "_substitute_placeholder_token_fn": "substitute_placeholder_token",
    "compute_logits": "compute_logits",
    "structured_decode": "structured_decoding",
    "_subtract_num_rejected_tokens_fn": "subtract_num_rejected_tokens",
    "greedy_rejection_sampler": "rejection_sampler",  # do_sampling is in the shape
    "random_rejection_sampler": "rejection_sampler",
    "_process_and_extend_logits": "process_and_extend_logits",
    "_extend_logits_simple": "extend_logits_simple",
}
# select_from_array's spec-decode variants index vocabulary-wide logits, not hidden states: families of their own
SELECT_FAMILY_OF_LABEL = {
    "select bonus tokens for spec decoding": "select_bonus_tokens",
    "select target tokens for spec decoding": "select_target_tokens",
}
_RUN_COMPILATION_OPTIONS = {"call_kwargs", "warmup_handler", "aot", "compile_only"}


# A name that carries shape scalars of its own: DFlash's warm-up names "drafter_propose (num_tokens=16)".
_NAMED_SCALARS = re.compile(r"^(?P<name>.*?) \((?P<scalars>\w+=-?\d+(?:, \w+=-?\d+)*)\)$")


def call_signature(name: str, kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A `_run_compilation` call's family and shape: the name's own scalars, then the logged kwargs."""
    named, scalars = _NAMED_SCALARS.match(name), {}
    if named:
        name = named["name"]
        scalars = {key: int(value) for key, value in (pair.split("=") for pair in named["scalars"].split(", "))}
    return family_of(name), {**scalars, **shape_of(kwargs)}


def family_of(name: str) -> str:
    name = re.sub(r"^worker\d+ ", "", name)
    if selected := re.match(r"select_from_array \[(?:worker\d+ )?(.*)\]$", name):
        return SELECT_FAMILY_OF_LABEL.get(selected.group(1), "select_from_array")
    if name.startswith("select_from_array"):
        return "select_from_array"
    return FAMILY_OF_NAME.get(name, name.replace(" ", "_"))


def shape_of(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The scalars tpu-inference logs for the call (compilation_manager._describe_signature), and an image
    shape, [height, width], as "HxW" (the vision encoder's warm-up sizes are lists it leaves out)."""
    return {k: _scalar(v) for k, v in kwargs.items()
            if k not in _RUN_COMPILATION_OPTIONS and (_scalar(v) is not None or v is None)}


def _scalar(value: Any) -> Any:
    if value is None or isinstance(value, (int, float, bool, str)):
        return value
    if isinstance(value, (list, tuple)) and value and all(isinstance(side, int) for side in value):
        return "x".join(str(side) for side in value)
    return None


# tpu-inference compiles family by family through one _run_compilation: a family is done when the next starts
PROGRESS = FamilyProgress()


def install(probe: Probe) -> None:
    from tpu_inference.runner.compilation_manager import CompilationManager
    from tpu_inference.runner.tpu_runner import TPUModelRunner

    CompilationManager._run_compilation = _measured_compilation(probe, CompilationManager._run_compilation)
    TPUModelRunner.execute_model = _measured_step(probe, "execute_model", TPUModelRunner.execute_model)
    TPUModelRunner.sample_tokens = _measured_step(probe, "sample_tokens", TPUModelRunner.sample_tokens)


def _measured_compilation(probe: Probe, run_compilation):
    @functools.wraps(run_compilation)
    def measured(self, name, fn, *args, **kwargs):
        family, shape = call_signature(name, kwargs)
        queued = len(self._warmup_tasks)
        started = time.perf_counter()
        _pin_pool(probe, self)
        with probe.window("call", family, shape), named_on_failure(family, shape):
            result = run_compilation(self, name, fn, *args, **kwargs)
        seconds = time.perf_counter() - started
        if len(self._warmup_tasks) == queued:
            PROGRESS.call(family, seconds)
        else:
            # The warm-up pass compiles what AOT lowering skipped (e.g. the backbone, not a jit): the call is said
            # when it has compiled there, with this pass's seconds.
            task_name, task_fn, task_args, task_kwargs, handler = self._warmup_tasks[-1]
            self._warmup_tasks[-1] = (task_name, task_fn, task_args, task_kwargs,
                                      _in_window(probe, family, shape, handler, seconds))
        return result

    return measured


class GraphCompileFailed(RuntimeError):
    """A planned graph the compiler refused (e.g. a Pallas kernel over its VMEM budget on that TPU generation, a
    graph over the chip's HBM), named by family and shape, with the compiler's own first line."""


@contextlib.contextmanager
def named_on_failure(family: str, shape: dict[str, Any]):
    try:
        yield
    except Exception as exc:
        said = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise GraphCompileFailed(f"{family} {shape} did not compile: {type(exc).__name__}: {said}") from exc


def _pin_pool(probe: Probe, manager) -> None:
    """With NUM_PRECOMPILE_WORKERS > 1 the manager submits each compile to its pool: tie the compile to the
    window of the call that submitted it, whichever worker runs it and whenever."""
    pool = manager._compile_executor
    if pool is None or getattr(pool, "_aotc_pinned", False):
        return
    submit = pool.submit

    def pinned_submit(fn, *args, **kwargs):
        return submit(probe.pinned(probe.current(), fn), *args, **kwargs)

    pool.submit, pool._aotc_pinned = pinned_submit, True


def _in_window(probe: Probe, family: str, shape: dict[str, Any], handler, aot_seconds: float):
    def warmup(fn, args, call_kwargs):
        started = time.perf_counter() - aot_seconds
        with probe.window("call", family, shape), named_on_failure(family, shape):
            result = handler(fn, args, call_kwargs) if handler is not None else fn(*args, **call_kwargs)
        PROGRESS.call(family, time.perf_counter() - started)
        return result

    return warmup


def _measured_step(probe: Probe, what: str, step):
    @functools.wraps(step)
    def measured(self, *args, **kwargs):
        shape = {"what": what}
        scheduler_output = args[0] if args and what == "execute_model" else None
        if scheduler_output is not None:
            shape.update(num_reqs=len(scheduler_output.num_scheduled_tokens),
                         num_tokens=scheduler_output.total_num_scheduled_tokens)
        with probe.window("step", "runtime", shape):
            return step(self, *args, **kwargs)

    return measured
