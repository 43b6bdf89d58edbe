"""A stack that sizes its own KV cache: the ``RunnerSpec`` side (``SizedByStack``: ``kv_blocks`` runs the
backend's sizing module in the runner's interpreter) and what both runners' sizing modules share inside it
(stopping vLLM's engine start once the stack has sized its KV cache, the stdin/stdout protocol).

vLLM's ``EngineCore._initialize_kv_caches`` runs the worker's ``determine_available_memory`` and
``get_kv_cache_configs``, then turns the workers' configs into the scheduler's KV block count
(``generate_scheduler_kv_cache_config``): that count is the answer, taken before the cache is allocated and
before any warm-up graph compiles. Imports vLLM only inside functions: runner-side.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from aotc.errors import BadInput
from aotc.processes import collect_garbage_rarely
from aotc.runners.flags import FLAG_ENV_VARS

if TYPE_CHECKING:
    from aotc.entry import Entry
    from aotc.runners.spec import RunnerSpec

SIZING_TIMEOUT = 900
# The engine argument that pins the block count (vLLM's CacheConfig.num_gpu_blocks_override); aotc/kv.py reads it here.
OVERRIDE = "num_gpu_blocks_override"


class SizedByStack:
    """Mixin for a ``RunnerSpec`` whose stack sizes the KV cache itself, as a stock server on the entry's device
    would (vLLM's ``determine_available_memory``): ``kv_blocks`` runs ``kv_sizer`` as ``python -m`` in the
    runner's interpreter, the entry's JSON on stdin, and reads ``{"kv_blocks": N}`` back. The sizer's
    ``SIZING_ENV`` names the variables that sizing reads besides the fingerprint's (e.g. the twin's HBM)."""

    kv_sizer: ClassVar[str]

    def kv_blocks(self: RunnerSpec, entry: Entry, environ: Mapping[str, str]) -> int:
        return size_in_runner(self, entry, environ, self.kv_sizer)

    def kv_sizing_inputs(self, environ: Mapping[str, str]) -> dict[str, Any]:
        sizer = importlib.import_module(self.kv_sizer)
        with open(sizer.__file__, "rb") as fh:
            code = hashlib.sha256(fh.read()).hexdigest()
        return {"sizing_env": {var: environ.get(var) for var in sizer.SIZING_ENV}, "sizer_sha256": code}


def size_in_runner(spec: RunnerSpec, entry: Entry, environ: Mapping[str, str], sizer: str) -> int:
    """The runner's sizing module in its own interpreter, with the entry's env as a build has it."""
    python = spec.python(environ)
    # this process's environment for the rest (PATH, HOME), but what the answer is keyed on only as given
    keyed = (*FLAG_ENV_VARS, *spec.env_vars, *importlib.import_module(sizer).SIZING_ENV)
    env = {k: v for k, v in os.environ.items() if k not in keyed}
    env.update({**environ, **{k: str(v) for k, v in entry.env.items()}})
    try:
        proc = subprocess.run([python, "-m", sizer], input=json.dumps(entry.to_dict()),
                              capture_output=True, text=True, timeout=SIZING_TIMEOUT, env=env)
        answer = last_json_line(proc.stdout) or {"error": last_line(proc.stderr)}
    except (OSError, subprocess.SubprocessError) as exc:
        answer = {"error": str(exc)}
    if not valid_kv_blocks(answer.get("kv_blocks")):
        raise BadInput(f"entry {entry.name}: the {entry.runner} stack could not size its KV cache in {python}: "
                       f"{answer.get('error') or answer} (pin engine.{OVERRIDE} to skip sizing)")
    return answer["kv_blocks"]


def valid_kv_blocks(value: Any) -> bool:
    """A KV block count: a positive JSON integer (not true, not 1e3, not -7)."""
    return type(value) is int and value > 0


def last_json_line(text: str) -> dict[str, Any] | None:
    """The sizing's answer: its last stdout line (the stack logs to stdout too)."""
    try:
        answer = json.loads(last_line(text))
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else "no output"


class Sized(Exception):
    """Raised out of the engine's start once the stack has sized its KV cache."""

    def __init__(self, num_blocks: int):
        super().__init__(num_blocks)
        self.num_blocks = num_blocks


def stop_when_sized() -> None:
    """Wrap the engine core's own step that turns the workers' KV configs into the scheduler's block count."""
    from vllm.v1.engine import core

    sized = core.generate_scheduler_kv_cache_config

    def generate_and_stop(kv_cache_configs):
        raise Sized(int(sized(kv_cache_configs).num_blocks))

    core.generate_scheduler_kv_cache_config = generate_and_stop


def sized_by(start: Callable[[Callable[[], None]], Any], entry: Entry) -> int:
    """The KV block count the stack sizes while ``start(before_start)`` starts its engine in this process
    (``before_start`` runs once the runner has set the entry's environment, before vLLM is imported)."""
    if entry.engine.get(OVERRIDE):
        raise ValueError(f"the entry pins {OVERRIDE}: nothing to size")
    try:
        start(stop_when_sized)
    except Sized as sized:
        return sized.num_blocks
    raise RuntimeError("the engine started without sizing its KV cache")


def main(size_kv: Callable[[Entry], int]) -> int:
    """The entry (``Entry.to_dict()``) as JSON on stdin; one JSON line out, ``{"kv_blocks": N}``, or
    ``{"error": "..."}`` with exit status 1 (the traceback goes to stderr)."""
    collect_garbage_rarely()
    from pydantic import TypeAdapter

    from aotc.runners.protocol import WireEntry

    try:
        blocks = size_kv(TypeAdapter(WireEntry).validate_json(sys.stdin.read()))
    except Exception as exc:  # one line for the core; the log has the traceback
        import traceback

        traceback.print_exc(file=sys.stderr)
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        return 1
    print(json.dumps({"kv_blocks": blocks}))
    return 0
