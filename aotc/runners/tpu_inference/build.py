"""build: vLLM-TPU starts on the staging cache; every precompile call is reported with the files it wrote,
then a traffic sweep adds what serving compiles beyond warm-up. The core judges the calls against the plan
(aotc/build.py: plan_coverage)."""

from __future__ import annotations

import os

from aotc.fingerprint import xla_flags
from aotc.runners.protocol import BuildResult, Graph, Request

from . import records
from .records import Record, touched
from .session import RUNNER, Session, effective_flags


def precompile_calls(recs: list[Record]) -> list[Graph]:
    """Each `_run_compilation` call (and its warm-up pass), with the cache files it touched, in call order."""
    return [Graph(family=r["family"], shape=r["shape"], keys=touched(r), compile_seconds=r["compile_seconds"])
            for r in recs if records.is_call(r)]


def flag_error(launch_env: dict[str, str]) -> str | None:
    """The fingerprint predicts the flags a stock server's engine core hashes (implied_flags once per
    import, aotc.fingerprint.xla_flags); this process started as that engine core does: check it did."""
    expected, actual = xla_flags(launch_env, RUNNER), effective_flags()
    if expected != actual:
        return (f"effective XLA flags {actual} differ from the fingerprint's {expected}: "
                "update the tpu-inference RunnerSpec's implied_flags for this tpu-inference")
    return None


def run_build(request: Request) -> BuildResult:
    launch_env = dict(os.environ)
    session = Session.start(request.entry, request.cache_dir)
    capture = session.records()
    result = BuildResult(calls=precompile_calls(capture),
                         startup=records.graphs_outside_calls(capture, records.STARTUP),
                         engine_start_seconds=round(session.start_seconds, 3), xla_flags=effective_flags())
    if error := flag_error(launch_env):
        return result.model_copy(update={"error": error})
    sent = session.drive_traffic(request.seed, request.traffic)
    recs = session.records()
    return result.model_copy(update={
        "traffic_requests": sent,
        "runtime": [Graph.model_validate(g) for g in records.graphs_outside_calls(recs, records.RUNTIME)],
        "xla_compile_seconds": records.compile_seconds(recs),
        "metrics": records.totals(records.family_table(recs, {})),
    })
