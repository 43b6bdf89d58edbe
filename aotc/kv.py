"""How the stack sizes an entry's KV cache, and where its answer is kept. The page count itself (one number
that build, verify, the fingerprint and every serving flag pin, because it is a shape in every backbone
graph: vLLM's ``num_gpu_blocks_override``) is ``aotc.fingerprint.entry_kv_blocks``.

The matrix's ``engine.num_gpu_blocks_override`` wins. Otherwise the runner's own stack sizes the cache as a
stock server on that hardware would (``RunnerSpec.kv_size``: tpu-inference fills the HBM left after the
weights, × ``gpu_memory_utilization``; on the CPU twin, the twin's stated HBM). Sizing starts the stack, so
its answer is kept on disk per fingerprint inputs (``$AOTC_HOME/kv-blocks/``): plan, fingerprint, build and
serve ask once. A runner without ``kv_size`` keeps the full-length rule: every sequence at
``max_model_len`` (its buckets' ``kv_page_size(entry)`` pages each) + vLLM's null block.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from aotc.errors import BadInput
from aotc.files import aotc_home, answer_path, keep_answer, kept_answer
from aotc.matrix import Entry
from aotc.runners.flags import FLAG_ENV_VARS
from aotc.runners.kv_sizing import OVERRIDE
from aotc.runners.tpu_host import has_tpu
SIZING_TIMEOUT = 900


class KvNotSized(BadInput):
    """The entry's page count is the stack's to size and sizing was not allowed here."""


def override(entry: Entry) -> int | None:
    value = entry.engine.get(OVERRIDE)
    return int(value) if value else None


def stack_kv_blocks(entry: Entry, environ: dict[str, str], key: dict[str, Any], *, size: bool = True) -> int:
    """The stack's sizing for ``key`` (aotc/fingerprint.py: entry_kv_blocks): from disk, else by starting
    the stack (``size=False``: never; ``KvNotSized``)."""
    cached = sizing_path(key, environ, entry.backend.kv_size)
    kept = kept_answer(cached, lambda answer: isinstance(answer, dict) and valid_kv_blocks(answer.get("kv_blocks")))
    if kept is not None:
        return kept["kv_blocks"]
    if not size:
        raise KvNotSized(f"entry {entry.name}: its KV page count is the {entry.runner} stack's to size on its "
                         f"device, and it was not sized here; pin engine.{OVERRIDE}")
    if entry.device == "tpu" and not has_tpu() and not entry.backend.tpu_targets_on_cpu_host:
        raise KvNotSized(f"entry {entry.name}: its KV page count is the {entry.runner} stack's to size on a TPU "
                         f"({entry.accelerator}) and this host has none: run on the pod's TPU type, or pin "
                         f"engine.{OVERRIDE}")
    blocks = run_sizing(entry, environ)
    keep_answer(cached, {"entry": entry.name, "kv_blocks": blocks})
    return blocks


def sizing_path(key: dict[str, Any], environ: dict[str, str], sizer: str | None = None) -> Path:
    """Where the stack's answer for ``key`` is kept (every fingerprint input but the count itself, and the
    variables the sizing reads besides, e.g. the twin's stated HBM), with aotc's version and the source of
    the runner's ``sizer`` module."""
    spec = importlib.util.find_spec(sizer) if sizer else None
    sources = [Path(spec.origin)] if spec is not None and spec.origin else []
    return answer_path(aotc_home(environ) / "kv-blocks", key, *sources)


def valid_kv_blocks(value: Any) -> bool:
    """A page count: a positive JSON integer (not true, not 1e3, not -7)."""
    return type(value) is int and value > 0


def run_sizing(entry: Entry, environ: dict[str, str]) -> int:
    """The runner's sizing module in its own interpreter, with the entry's env as a build has it."""
    spec = entry.backend
    python = spec.python(environ)
    # this process's environment for the rest (PATH, HOME), but what the answer is keyed on only as given
    keyed = (*FLAG_ENV_VARS, *spec.env_vars, *spec.kv_sizing_env())
    env = {k: v for k, v in os.environ.items() if k not in keyed}
    env.update({**environ, **{k: str(v) for k, v in entry.env.items()}})
    try:
        proc = subprocess.run([python, "-m", spec.kv_size], input=json.dumps(entry.to_dict()),
                              capture_output=True, text=True, timeout=SIZING_TIMEOUT, env=env)
        answer = last_json_line(proc.stdout) or {"error": last_line(proc.stderr)}
    except (OSError, subprocess.SubprocessError) as exc:
        answer = {"error": str(exc)}
    if not valid_kv_blocks(answer.get("kv_blocks")):
        raise BadInput(f"entry {entry.name}: the {entry.runner} stack could not size its KV cache in {python}: "
                       f"{answer.get('error') or answer} (pin engine.{OVERRIDE} to skip sizing)")
    return answer["kv_blocks"]


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
