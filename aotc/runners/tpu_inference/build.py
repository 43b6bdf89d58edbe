"""build: vLLM-TPU starts on the staging cache; every precompile call is reported with the files it wrote,
then a traffic sweep adds what serving compiles beyond warm-up. The core judges the calls against the plan
(aotc/build.py: plan_coverage)."""

from __future__ import annotations

import os
import time

from aotc.entry import Entry
from aotc.runners.flags import xla_flags
from aotc.runners import records
from aotc.runners.protocol import BuildResult, Graph, Request
from aotc.runners.records import CALL, Record, touched

from . import engine
from .plan.buckets import implied_flags
from .session import RUNNER, Session, effective_flags

GIB = 1 << 30


def precompile_calls(recs: list[Record]) -> list[Graph]:
    """Each `_run_compilation` call (and its warm-up pass), with the cache files it touched, in call order."""
    return [Graph(family=r.family, shape=r.shape, keys=touched(r), compile_seconds=r.compile_seconds,
                  compiled=max(r.compiled, key=lambda f: f.get("peak_memory_bytes", 0), default={}))
            for r in recs if r.kind == CALL]


def graphs_outside_calls(recs: list[Record], family: str) -> list[Graph]:
    """Startup or runtime windows that wrote cache files: graphs the plan does not list by shape."""
    return [Graph(family=family, shape=r.shape or {"what": r.family}, keys=sorted(r.written),
                  compile_seconds=r.compile_seconds)
            for r in recs if r.kind != CALL and records.family_of(r) == family and r.written]


def target_compiled_for(entry: Entry) -> dict | None:
    """What the graphs were compiled for on this host without a TPU (the manifest's ``target``), else None."""
    from . import compile_only
    from .topology import target_facts

    if not compile_only.installed():
        return None
    from tpu_inference.utils import get_device_hbm_limit

    return {**target_facts(engine.compile_only_target(entry), compile_only.devices()),
            "hbm_bytes_per_device": get_device_hbm_limit()}


def over_hbm(calls: list[Graph], target: dict) -> str | None:
    """The first graph whose executable needs more HBM per device than the target's: weights and KV blocks are
    among its arguments, so this is the entry not fitting the accelerator."""
    limit = target["hbm_bytes_per_device"]
    for graph in calls:
        peak = graph.compiled.get("peak_memory_bytes", 0)
        if peak > limit:
            figures = ", ".join(f"{name} {value / GIB:.2f} GiB" for name, value in graph.compiled.items()
                                if name != "generated_code_bytes")
            return (f"{graph.family} {graph.shape} needs {peak / GIB:.2f} GiB of HBM per device ({figures}); a "
                    f"{target['device_kind']} of {target['accelerator']} has {limit / GIB:.2f} GiB")
    return None


def flag_error(launch_env: dict[str, str], entry: Entry) -> str | None:
    """The fingerprint predicts the flags every process layout hashes (the stack's flags once, collapsed by the
    twin plugin after tpu-inference's import; the twin's device count once; aotc.runners.flags.xla_flags):
    check this process hashes them."""
    expected = xla_flags(launch_env, RUNNER, entry_flags=implied_flags(entry))
    actual = effective_flags()
    if expected != actual:
        return (f"effective XLA flags {actual} differ from the fingerprint's {expected}: "
                "update the tpu-inference RunnerSpec's stack_flags for this tpu-inference")
    return None


def run_build(request: Request) -> BuildResult:
    if request.precompile_workers:
        # tpu-inference's own parallel precompile (CompilationManager's pool); not a cache-key input
        os.environ["NUM_PRECOMPILE_WORKERS"] = str(request.precompile_workers)
    launch_env = dict(os.environ)
    session = Session.start(request.entry, request.cache_dir, [g.model_dump() for g in request.plan])
    capture = session.records()
    target = target_compiled_for(request.entry)
    result = BuildResult(calls=precompile_calls(capture),
                         startup=graphs_outside_calls(capture, records.STARTUP),
                         engine_start_seconds=round(session.start_seconds, 3), xla_flags=effective_flags(),
                         target=target)
    if error := flag_error(launch_env, request.entry) or (target and over_hbm(result.calls, target)):
        return result.model_copy(update={"error": error})
    started = time.perf_counter()
    sent = session.drive_traffic(request.seed, request.traffic)
    traffic_seconds = time.perf_counter() - started
    recs = session.records()
    return result.model_copy(update={
        "traffic_requests": sent,
        "traffic_seconds": round(traffic_seconds, 3),
        # every cache file looked up and found, every one written: the core counts reuse from these
        "cache_reads": sorted({k for r in recs for k in r.found}),
        "cache_writes": sorted({k for r in recs for k in r.written}),
        "runtime": graphs_outside_calls(recs, records.RUNTIME),
        "xla_compile_seconds": records.compile_seconds(recs),
        "metrics": records.totals(records.family_table(recs)),
    })
