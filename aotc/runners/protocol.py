"""The protocol between the core and a runner process, backend-neutral (docs/design.md, "Runner interface").

``python -m <RunnerSpec.module> {build|verify} REQUEST.json RESULT.json``: the core (aotc/build.py:
run_runner) writes a ``Request``, the runner writes a ``BuildResult`` or a ``VerifyResult``. Every model
forbids unknown keys, so a misspelled key fails on the side that reads it instead of becoming 0.
Exit 0 ok, 1 a check failed (the result carries ``error``), 2 bad usage or request.

Progress: when ``AOTC_PROGRESS_FD`` names a pipe, the runner writes one ``Progress`` JSON line to it per
finished graph family; the core reads the pipe as lines arrive. The runner's log (stdout, stderr) stays a
log, never parsed.

The runner reports what it saw, the core judges: plan coverage (a planned graph with no key, a capture
compile the plan does not list) is decided by the core alone (aotc/build.py: plan_coverage) from
``BuildResult.calls`` and ``BuildResult.capture_outside``.
One entry per process: the compiler runtimes are process-global and cannot be reset between entries.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, PlainValidator, ValidationError

from aotc.entry import Entry
from aotc.processes import collect_garbage_rarely

PROGRESS_FD_ENV = "AOTC_PROGRESS_FD"
Mode = Literal["build", "verify"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PlannedGraph(_Strict):
    family: str
    shape: dict[str, Any]
    beyond_warmup: bool = False
    """The stack's warm-up skips it; the runner compiles it as the warm-up would (GraphSpec.beyond_warmup)."""


def _entry(value: Any) -> Entry:
    if isinstance(value, Entry):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"not a matrix entry: expected a mapping, got {type(value).__name__}")
    try:
        return Entry.from_dict(value)
    except TypeError as exc:
        raise ValueError(f"not a matrix entry: {exc}") from None


# On the wire ``Entry.to_dict()``, its fields checked; in a runner, the ``Entry`` itself.
WireEntry = Annotated[Entry, PlainValidator(_entry), PlainSerializer(Entry.to_dict)]


class Request(_Strict):
    entry: WireEntry
    """The matrix entry (aotc/entry.py); JSON ``Entry.to_dict()`` in the request file."""
    plan: list[PlannedGraph]
    cache_dir: str
    traffic: int = Field(default=32, ge=0)
    seed: int = 0
    precompile_workers: int | None = Field(default=None, ge=1)
    """The backend's own parallel precompile (tpu-inference: NUM_PRECOMPILE_WORKERS); None: its default."""


class Graph(_Strict):
    """One graph the runner saw compile (or be looked up), with the cache keys (files) it touched."""

    family: str
    shape: dict[str, Any]
    keys: list[str] = []
    compile_seconds: float = 0.0
    compiled: dict[str, int] = {}
    """For a TPU target built on a host without one: the compiler's per-device figures of the graph's
    executable (generated_code_bytes, argument_bytes, output_bytes, alias_bytes, temp_bytes, peak_memory_bytes)."""


class BuildResult(_Strict):
    calls: list[Graph] = []
    """Every graph call the stack's warm-up (capture) made, by family and shape, in call order."""
    capture_outside: list[Graph] = []
    """Cache files written during warm-up outside any graph call (the plan cannot name them)."""
    startup: list[Graph] = []
    """Graphs compiled during start-up before warm-up (kept in the manifest, not planned)."""
    runtime: list[Graph] = []
    """Graphs the traffic sweep compiled beyond warm-up."""
    unattributed: list[str] = []
    """Cache files no window saw being written."""
    cache_reads: list[str] = []
    """Cache files looked up and found (a runner whose cache loads; aotc/reuse.py counts reuse from them)."""
    cache_writes: list[str] = []
    """Cache files written."""
    traffic_requests: int = 0
    engine_start_seconds: float | None = None
    traffic_seconds: float | None = None
    """Wall seconds of the traffic sweep (None: the runner does not time it)."""
    xla_compile_seconds: float = 0.0
    xla_flags: list[str] = []
    metrics: dict[str, Any] = {}
    target: dict[str, Any] | None = None
    """The TPU the graphs were compiled for on a host without one (platform, platform_version, topology,
    device_kind, ...); None: compiled on the device the entry names."""
    error: str | None = None


class FamilyRow(_Strict):
    """One row of verify's per-family table, the same vocabulary for every runner (0: not observed).

    ``found``: the graph's entry was in the cache (loaded or not); ``loads``: an executable really
    deserialized from it and used; ``misses``: a graph the artifact lacks."""

    requests: int = 0
    found: int = 0
    loads: int = 0
    misses: int = 0
    writes: int = 0
    new_files: int = 0
    rewritten_files: int = 0
    compiles: int = 0
    uncached_compiles: int = 0
    deserialize_failures: int = 0


ROW_FIELDS = tuple(FamilyRow.model_fields)


class Missed(_Strict):
    family: str
    shape: dict[str, Any]
    key: str


class VerifyResult(_Strict):
    families: dict[str, FamilyRow] = {}
    misses: int = 0
    missed: list[Missed] = []
    replayed_graphs: int = 0
    traffic_requests: int = 0
    loadable: bool = False
    """The runner's belief; the core only reports a load the rows show (aotc/verify.py)."""
    unproven: str | None = None
    """Why this host cannot show a load at all (a TPU artifact verified on a host without a TPU)."""
    engine_start_seconds: float | None = None
    evidence: str = ""
    metrics: dict[str, Any] = {}
    warnings: list[str] = []
    error: str | None = None


class Progress(_Strict):
    family: str
    seconds: float


RESULTS: dict[str, type[BuildResult] | type[VerifyResult]] = {"build": BuildResult, "verify": VerifyResult}


def report_progress(family: str, seconds: float) -> None:
    """One progress line on the core's pipe; a runner started by hand (no pipe) reports nothing."""
    fd = os.environ.get(PROGRESS_FD_ENV)
    if fd:
        line = Progress(family=family, seconds=round(seconds, 2)).model_dump_json() + "\n"
        try:
            os.write(int(fd), line.encode())
        except OSError:  # the core went away; the build result still lands on disk
            pass


class FamilyProgress:
    """For stacks that compile family by family without a per-family hook: a family is done when a call of
    another family starts (or at ``flush``)."""

    def __init__(self) -> None:
        self.family: str | None = None
        self.seconds = 0.0

    def call(self, family: str, seconds: float) -> None:
        if family != self.family:
            self.flush()
            self.family = family
        self.seconds += seconds

    def flush(self) -> None:
        if self.family is not None:
            report_progress(self.family, self.seconds)
        self.family, self.seconds = None, 0.0


def load_request(path: str, mode: Mode) -> Request:
    with open(path) as fh:
        request = Request.model_validate_json(fh.read())
    if mode == "verify" and not os.path.isdir(request.cache_dir):
        raise ValueError(f"no cache at {request.cache_dir}")
    return request


def runner_main(prog: str, run: Callable[[Mode, Request], BuildResult | VerifyResult],
                argv: list[str] | None = None, check: Callable[[Entry], None] | None = None) -> int:
    """A runner process's main: parse argv, validate the request (``check`` adds the runner's own rules;
    ValueError → exit 2), run it and always leave a result file. (``RunnerSpec.serve`` is the other "serve":
    the stock ``vllm serve`` of an entry.)"""
    collect_garbage_rarely()
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("mode", choices=["build", "verify"])
    parser.add_argument("request")
    parser.add_argument("result")
    args = parser.parse_args(argv)
    _keep_progress_pipe_private()
    try:
        request = load_request(args.request, args.mode)
        if check:
            check(request.entry)
    except (OSError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        print(f"bad request {args.request}: {_one_line(exc)}", file=sys.stderr)
        return 2
    try:
        result = RESULTS[args.mode].model_validate(run(args.mode, request))
    except Exception as exc:  # the core needs a result file whatever happened
        traceback.print_exc()
        result = RESULTS[args.mode](error=f"{type(exc).__name__}: {exc}")
    with open(args.result, "w") as fh:
        fh.write(result.model_dump_json(indent=2))
    if result.error:
        print(f"aotc runner {args.mode} failed: {result.error}", file=sys.stderr)
        return 1
    return 0


def read_result(path: str, mode: Mode) -> BuildResult | VerifyResult:
    with open(path) as fh:
        return RESULTS[mode].model_validate_json(fh.read())


def _one_line(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        return f"{'.'.join(map(str, err['loc']))}: {err['msg']}"
    return str(exc)


def _keep_progress_pipe_private() -> None:
    # processes the stack execs (compile workers, tools) must not hold the core's pipe open
    fd = os.environ.get(PROGRESS_FD_ENV)
    if fd:
        try:
            os.set_inheritable(int(fd), False)
        except (OSError, ValueError):
            os.environ.pop(PROGRESS_FD_ENV, None)


