"""The canary's LoRA adapters: those the stock server is started with (the matrix's ``lora_modules``, else a
random one shaped for the model, aotc/runners/lora.py), and one more loaded at run time
(``/v1/load_lora_adapter``), sent requests and unloaded."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aotc.canary_requests import RequestLimits, plan_requests
from aotc.canary_send import KindOutcome, send_kinds
from aotc.engine_args import lora_module_paths
from aotc.errors import BadInput
from aotc.matrix import Entry
from aotc.runners.lora import ADAPTER_NAME, write_adapter
from aotc.runners.traffic import lora_slots
from aotc.server import ServerCommand

# vLLM's switch for /v1/load_lora_adapter and /v1/unload_lora_adapter (a pod-only setting: no graph).
RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
RUNTIME_ADAPTER = "aotc-lora-runtime"


@dataclass(frozen=True)
class Adapters:
    served: dict[str, str] = field(default_factory=dict)
    """name -> dir the stock server is started with (besides those the matrix names)."""
    named: tuple[str, ...] = ()
    """Every adapter name the server serves from start (the matrix's and ``served``)."""
    runtime: str | None = None
    """An adapter dir to load at run time, send requests to and unload; None: no LoRA."""

    def models(self, base: str) -> tuple[str, ...]:
        return (base, *self.named)


def canary_adapters(entry: Entry, work: Path) -> Adapters:
    """The adapters of an entry with enable_lora: the matrix's ``lora_modules`` if it names any, else a
    random one written for the model (graphs depend on max_loras / max_lora_rank, not on an adapter)."""
    if not lora_slots(entry.engine):
        return Adapters()
    named = lora_module_paths(entry.engine.get("lora_modules"))
    config_path = entry.model_config_path
    if config_path is None:
        if not named:
            raise BadInput(f"canary: {entry.name} enables LoRA but names no lora_modules, and its model has no "
                           "local config.json to shape a test adapter for")
        return Adapters(named=tuple(named), runtime=next(iter(named.values())))
    rank = min(8, int(entry.engine.get("max_lora_rank") or 8))
    path = str(write_adapter(work / "lora", json.loads(config_path.read_text()), rank=rank))
    served = {} if named else {ADAPTER_NAME: path}
    return Adapters(served=served, named=tuple({**named, **served}), runtime=path)


# The kinds sent to an adapter loaded at run time: sampling with and without logprobs, and requests naming it.
RUNTIME_KINDS = ("greedy", "sampling", "logprobs", "stop", "lora")


def run_runtime_adapter(command: ServerCommand, entry: Entry, path: str, unserved: dict[str, str],
                        seed: int) -> tuple[dict[str, KindOutcome], str | None]:
    """Load an adapter into the running server, send it and the base model some kinds, unload it.
    Returns the kinds' outcomes and the problem loading or unloading it (None: none)."""
    loaded = post_json(command.url + "/v1/load_lora_adapter", {"lora_name": RUNTIME_ADAPTER, "lora_path": path}, 60)
    if isinstance(loaded, str):
        return {}, f"load_lora_adapter: {loaded}"
    limits = RequestLimits.of(entry, (RUNTIME_ADAPTER,))
    planned = [p for p in plan_requests(limits, seed + 1, dict(unserved)) if p.kind.name in RUNTIME_KINDS]
    outcomes = send_kinds(command.url, planned, (RUNTIME_ADAPTER, command.model))
    unloaded = post_json(command.url + "/v1/unload_lora_adapter", {"lora_name": RUNTIME_ADAPTER}, 60)
    return outcomes, (f"unload_lora_adapter: {unloaded}" if isinstance(unloaded, str) else None)


def post_json(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any] | str:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            text = response.read()
        try:
            return json.loads(text)
        except ValueError:  # /v1/load_lora_adapter answers 200 with plain text
            return {"text": text.decode(errors="replace")}
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code} for {sorted(k for k in body if k not in ('prompt', 'model'))}: {exc.read()[:200]!r}"
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        return f"request failed ({sorted(k for k in body if k not in ('prompt', 'model'))}): {exc}"
