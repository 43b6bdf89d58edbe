"""How the stack sizes an entry's KV cache, and where its answer is kept. The block count itself (one number
that build, verify, the fingerprint and every serving flag pin, because it is a shape in every backbone
graph: vLLM's ``num_gpu_blocks_override``) is ``aotc.fingerprint.entry_kv_blocks``.

The matrix's ``engine.num_gpu_blocks_override`` wins. Otherwise the runner's ``RunnerSpec.kv_blocks``: where
its own stack sizes the cache as a stock server on that hardware would (``kv_sizing_inputs`` not None, both
built-in runners: the stack fills the HBM left after the weights, × ``gpu_memory_utilization``; on the CPU twin,
the twin's stated HBM), sizing starts the stack, so its answer is kept on disk per fingerprint inputs
(``$AOTC_HOME/kv-blocks/``): plan, fingerprint, build and serve ask once. Otherwise its rule (by default
the full-length one: every sequence at ``max_model_len`` + vLLM's null block).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aotc.errors import BadInput
from aotc.files import aotc_home, answer_path, keep_answer, kept_answer
from aotc.entry import Entry
from aotc.runners.kv_sizing import OVERRIDE, valid_kv_blocks
from aotc.runners.tpu_host import compiles_without_running


class KvNotSized(BadInput):
    """The entry's KV block count is the stack's to size and sizing was not allowed here."""


def override(entry: Entry) -> int | None:
    value = entry.engine.get(OVERRIDE)
    return int(value) if value else None


def stack_kv_blocks(entry: Entry, environ: dict[str, str], key: dict[str, Any], *, size: bool = True) -> int:
    """The stack's sizing for ``key`` (aotc/fingerprint.py: entry_kv_blocks): from disk, else by starting
    the stack (``size=False``: never; ``KvNotSized``)."""
    cached = sizing_path(key, environ)
    kept = kept_answer(cached, lambda answer: isinstance(answer, dict) and valid_kv_blocks(answer.get("kv_blocks")))
    if kept is not None:
        return kept["kv_blocks"]
    if not size:
        raise KvNotSized(f"entry {entry.name}: its KV block count is the {entry.runner} stack's to size on its "
                         f"device, and it was not sized here; pin engine.{OVERRIDE}")
    if compiles_without_running(entry.device) and not entry.backend.tpu_targets_on_cpu_host:
        raise KvNotSized(f"entry {entry.name}: its KV block count is the {entry.runner} stack's to size on a TPU "
                         f"({entry.accelerator}) and this host has none: run on the pod's TPU type, or pin "
                         f"engine.{OVERRIDE}")
    blocks = entry.backend.kv_blocks(entry, environ)
    keep_answer(cached, {"entry": entry.name, "kv_blocks": blocks})
    return blocks


def sizing_path(key: dict[str, Any], environ: dict[str, str]) -> Path:
    """Where the stack's answer for ``key`` is kept (every fingerprint input but the count itself, and what the
    sizing reads besides: ``RunnerSpec.kv_sizing_inputs``), with aotc's version."""
    return answer_path(aotc_home(environ) / "kv-blocks", key)
