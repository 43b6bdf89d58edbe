"""The KV cache's page count of an entry: one number that build, verify, the fingerprint and every serving flag
pin, because it is a shape in every backbone graph (vLLM's ``num_gpu_blocks_override``).

The matrix's ``engine.num_gpu_blocks_override`` wins. Otherwise the runner's own stack sizes the cache as a
stock server on that hardware would (``RunnerSpec.kv_size``: tpu-inference fills the HBM left after the
weights, × ``gpu_memory_utilization``; on the CPU twin, the twin's stated HBM). Sizing starts the stack, so
its answer is kept on disk per fingerprint inputs (``$AOTC_HOME/kv-blocks/``): plan, fingerprint, build and
serve ask once. A runner without ``kv_size`` keeps the full-length rule: every sequence at
``max_model_len`` (its buckets' ``kv_page_size(entry)`` pages each) + vLLM's null block.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from aotc.errors import BadInput
from aotc.matrix import Entry
from aotc.runners.spec import load_runner

OVERRIDE = "num_gpu_blocks_override"
SIZING_TIMEOUT = 900


class KvNotSized(BadInput):
    """The entry's page count is the stack's to size and sizing was not allowed here."""


def full_length_blocks(max_num_seqs: int, max_model_len: int, page_size: int) -> int:
    """Every sequence at full length, +1 for the null block vLLM reserves."""
    return max_num_seqs * -(-max_model_len // page_size) + 1


def override(entry: Entry) -> int | None:
    value = entry.engine.get(OVERRIDE)
    return int(value) if value else None


def entry_kv_blocks(entry: Entry, environ: dict[str, str] | None = None, *, size: bool = True) -> int | None:
    """The page count the entry pins; None for a runner that pins none. ``size=False``: never start the stack
    (an init container has neither it nor the accelerator): a sizing not on disk raises ``KvNotSized``."""
    if (pinned := override(entry)) is not None:
        return pinned
    spec = load_runner(entry.runner)
    if spec.kv_size:
        return stack_kv_blocks(entry, dict(os.environ if environ is None else environ), size=size)
    page = getattr(spec.load("buckets"), "kv_page_size", None)
    return full_length_blocks(entry.max_num_seqs, entry.max_model_len, page(entry)) if page else None


def pin_kv(entry: Entry, environ: dict[str, str] | None = None, kv_blocks: int | None = None) -> Entry:
    """The entry with its page count written into its engine arguments, as build, verify and the stock
    server pass it (``kv_blocks``: a count already known, e.g. a manifest's)."""
    blocks = kv_blocks if kv_blocks is not None else entry_kv_blocks(entry, environ)
    if blocks is None or override(entry) == blocks:
        return entry
    return dataclasses.replace(entry, engine={**entry.engine, OVERRIDE: blocks})


def stack_kv_blocks(entry: Entry, environ: dict[str, str], *, size: bool = True) -> int:
    cached = sizing_path(entry, environ)
    try:
        return int(json.loads(cached.read_text())["kv_blocks"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if not size:
        raise KvNotSized(f"entry {entry.name}: its KV page count is the {entry.runner} stack's to size on its "
                         f"device, and it was not sized here; pin engine.{OVERRIDE}")
    blocks = run_sizing(entry, environ)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"entry": entry.name, "kv_blocks": blocks}))
        os.replace(tmp, cached)
    except OSError:
        pass  # a read-only home only costs the next command another sizing
    return blocks


def sizing_path(entry: Entry, environ: dict[str, str]) -> Path:
    """Where the stack's answer for these inputs is kept: every fingerprint input but the count itself, and
    the variables the sizing reads besides (the twin's stated HBM)."""
    from aotc.fingerprint import canonical_json, fingerprint_inputs

    sizing_env = load_runner(entry.runner).load("kv_size").SIZING_ENV
    key = {"inputs": fingerprint_inputs(entry, environ, kv_blocks=None),
           "sizing_env": {var: environ.get(var) for var in sizing_env}}
    home = environ.get("AOTC_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "aotc")
    return Path(home) / "kv-blocks" / f"{hashlib.sha256(canonical_json(key)).hexdigest()}.json"


def run_sizing(entry: Entry, environ: dict[str, str]) -> int:
    """The runner's sizing module in its own interpreter, with the entry's env as a build has it."""
    from aotc.fingerprint import FLAG_ENV_VARS, runner_python

    spec = load_runner(entry.runner)
    python = runner_python(entry.runner, environ)
    # this process's environment for the rest (PATH, HOME), but what the answer is keyed on only as given
    keyed = (*FLAG_ENV_VARS, *spec.env_vars, *spec.load("kv_size").SIZING_ENV)
    env = {k: v for k, v in os.environ.items() if k not in keyed}
    env.update({**environ, **{k: str(v) for k, v in entry.env.items()}})
    try:
        proc = subprocess.run([python, "-m", spec.kv_size], input=json.dumps(entry.to_dict()),
                              capture_output=True, text=True, timeout=SIZING_TIMEOUT, env=env)
        answer = last_json_line(proc.stdout) or {"error": last_line(proc.stderr)}
    except (OSError, subprocess.SubprocessError) as exc:
        answer = {"error": str(exc)}
    if "kv_blocks" not in answer:
        raise BadInput(f"entry {entry.name}: the {entry.runner} stack could not size its KV cache in {python}: "
                       f"{answer.get('error')} (pin engine.{OVERRIDE} to skip sizing)")
    return int(answer["kv_blocks"])


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
