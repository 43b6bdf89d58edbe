"""What a backend's watcher is built from: the serving guard (aotc/guard.py) installs a runner's watcher
(``RunnerSpec.watcher``) in a serving engine; the watcher reads the stack's compile counters at step
boundaries and reports each step that compiled as a ``StepCompiles``. Interface only: no backend, no guard.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol


class WatchedSession(Protocol):
    """What a watcher may ask of the guard's session."""

    ready: bool

    def count(self, *, compiles: int = 0, hits: int = 0, misses: int = 0) -> None: ...

    def compiled(self, step: StepCompiles) -> None: ...


def uncovered_families(graphs: Any, step: dict[str, Any], families: Mapping[str, tuple[str, ...]]) -> list[str]:
    """Families of this step whose padded shape no manifest graph record has.

    ``families`` maps each family a step runs to the step fields that pick its bucket (a runner's table).
    """
    def covered(family: str, keys: tuple[str, ...]) -> bool:
        return any(g.family == family and all(g.shape.get(k) == step.get(k) for k in keys) for g in graphs)

    return [f"{f}[{', '.join(f'{k}={step.get(k)}' for k in keys)}]"
            for f, keys in families.items() if not covered(f, keys)]


# --- after ready: what the runner's watcher reports -----------------------------------------------


@dataclass(frozen=True)
class StepCompiles:
    """What one step compiled, as a watcher saw it."""

    where: str  # execute_model | sample_tokens
    compiles: int  # graphs compiled (not loaded from the cache)
    evidence: dict[str, int]  # the backend's own counters that moved, by their names
    step: dict[str, Any]  # the step's padded shape
    family: str  # metrics label: the first family the manifest lacks, "unplanned" or "cached"
    explanation: str
    functions: tuple[str, ...] = ()  # compiled functions with their argument shapes, when the backend names them
    request_ids: tuple[str, ...] = ()


def counter_delta(before: dict[str, int], now: dict[str, int]) -> dict[str, int]:
    """What grew; a counter that dropped was reset (torch_xla's dynamo bridge), so its value is the growth."""
    return {k: v - before.get(k, 0) if v >= before.get(k, 0) else v for k, v in now.items()}


class StepWatch:
    """A backend's cumulative counters read at step boundaries: what grew during a step, that step did."""

    def __init__(self, counters: Callable[[], dict[str, int]]):
        self._counters = counters
        self.last: dict[str, int] = {}

    def start(self) -> dict[str, int]:
        self.last = self._counters()
        return dict(self.last)

    def delta(self) -> dict[str, int]:
        now = self._counters()
        new = {k: v for k, v in counter_delta(self.last, now).items() if v}
        self.last = now
        return new


class StepWatcher:
    """Base of the runners' watchers: the stack's cumulative counters, read when warm-up ends and after each
    step. A subclass names its counters and explains a step that compiled; ``live_flags``: see check_cache."""

    live_flags = False
    hits_counter = "hits"
    misses_counter = "misses"

    def __init__(self, session: WatchedSession, counters: Callable[[], dict[str, int]]):
        self.session = session
        self.steps = StepWatch(counters)

    def compiles_in(self, counts: dict[str, int]) -> int:
        raise NotImplementedError

    def describe(self, worker: Any, what: str, scheduled: Any, new: dict[str, int], compiles: int) -> StepCompiles:
        raise NotImplementedError

    def ready(self) -> None:
        at_ready = self.steps.start()
        self.session.count(compiles=self.compiles_in(at_ready), hits=at_ready.get(self.hits_counter, 0),
                           misses=at_ready.get(self.misses_counter, 0))

    def on_step(self, worker: Any, what: str, scheduled: Any) -> None:
        if not self.session.ready:
            return
        new = self.steps.delta()
        if not new:
            return
        self.session.count(hits=new.get(self.hits_counter, 0), misses=new.get(self.misses_counter, 0))
        compiles = self.compiles_in(new)
        if compiles:
            self.session.compiled(self.describe(worker, what, scheduled, new, compiles))


def first_patch(cls: Any) -> bool:
    """True the first time for ``cls``: general plugins load more than once per process."""
    if cls.__dict__.get("_aotc_guarded"):
        return False
    cls._aotc_guarded = True
    return True


def patch_steps(worker_cls: Any, on_step: Callable[[Any, str, Any], None]) -> None:
    """Call ``on_step(worker, what, scheduler_output)`` after each ``execute_model`` / ``sample_tokens``."""
    if not first_patch(worker_cls):
        return
    for what in ("execute_model", "sample_tokens"):
        setattr(worker_cls, what, _at_step_boundary(getattr(worker_cls, what), what, on_step))


def _at_step_boundary(method: Callable, what: str, on_step: Callable[[Any, str, Any], None]) -> Callable:
    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        result = method(self, *args, **kwargs)
        if what == "execute_model" and args:
            self._aotc_scheduled = args[0]  # sample_tokens finishes the step execute_model scheduled
        on_step(self, what, self.__dict__.get("_aotc_scheduled"))
        return result

    return wrapped


def scheduled_request_ids(scheduler_output: Any) -> tuple[str, ...]:
    return tuple(scheduler_output.num_scheduled_tokens) if scheduler_output is not None else ()


# --- patch a module when it is imported -----------------------------------------------------------


def when_imported(name: str, callback: Callable[[Any], None]) -> None:
    """Run ``callback(module)`` now if ``name`` is imported, else right after its import.

    Importing vLLM's TPU worker here would pull torch_xla into processes that never use it (the API
    server); a one-shot import hook patches it in exactly the processes that load it.
    """
    if name in sys.modules:
        callback(sys.modules[name])
    elif not any(isinstance(f, _PostImportHook) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportHook(name, callback))


class _PostImportHook(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, callback: Callable[[Any], None]):
        self.name, self.callback = name, callback

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_patch(module: Any) -> None:
            exec_module(module)
            self.callback(module)

        spec.loader.exec_module = exec_then_patch
        return spec
