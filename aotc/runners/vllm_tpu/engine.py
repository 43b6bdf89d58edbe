"""Entry -> process environment and vLLM engine arguments.

`device: tpu` is vLLM's own start-up with VLLM_XLA_CACHE_PATH at the staging
dir (vLLM writes `tp<N>_rank<r>/` under it) and the measuring worker.
`device: cpu` is the same plus the CPU-twin platform plugin, which vLLM only
activates when AOTC_CPU_TWIN=1.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from aotc.entry import Entry
from aotc.runners.vllm_engine import Env, VllmEngine


TPU_WORKER = "aotc.runners.vllm_tpu.worker.AotcTPUWorker"
CPU_WORKER = "aotc.runners.vllm_tpu.worker.CpuTwinWorker"
CPU_SERVING_WORKER = "aotc.runners.vllm_tpu.worker.CpuTwinServingWorker"
SERVE_SEED = 0  # vLLM's default; torch_xla's graphs do not depend on it (verify runs seed 1)
DEVICE_NAME_ENV = "AOTC_TWIN_DEVICE_NAME"  # read by twin.platform


def device_name(accelerator: str) -> str:
    """'v6e-8' -> 'TPU V6E', the name tpu_info would report for that chip."""
    return "TPU " + accelerator.split("-", 1)[0].upper()


def local_model(entry: Entry) -> str | None:
    """The local model dir: the matrix's resolved model_path (its ``model`` is relative to the matrix
    file, not to this process), else ``model`` itself when it is a directory."""
    if entry.model_path:
        return entry.model_path
    return entry.model if os.path.isdir(entry.model) else None


class VllmTpuEngine(VllmEngine):
    """vLLM 0.13's TPU runner on torch_xla: aotc's measuring worker, the twin on PJRT's CPU client."""

    serve_seed = SERVE_SEED

    def check(self, entry: Entry) -> None:
        super().check(entry)
        if entry.device == "cpu" and entry.tensor_parallel_size != 1:
            # Each rank would get its own PJRT CPU client with ordinal 0, so ranks
            # would share tp<N>_rank0 and no collective would run: not a TPU's graphs.
            raise ValueError("device cpu supports tensor_parallel_size 1 only")

    def local_model(self, entry: Entry) -> str | None:
        return local_model(entry)

    def device_env(self, entry: Entry, environ: Mapping[str, str]) -> Env:
        if entry.device != "cpu":
            return {}
        # Single-host gloo rendezvous (VLLM_HOST_IP); keeps the twin off the network.
        return {"PJRT_DEVICE": "CPU", DEVICE_NAME_ENV: device_name(entry.accelerator), "VLLM_HOST_IP": "127.0.0.1"}

    def runner_args(self, entry: Entry) -> dict[str, Any]:
        return {"worker_cls": CPU_WORKER if entry.device == "cpu" else TPU_WORKER}

    def serve_runner_args(self, entry: Entry) -> dict[str, Any]:
        """vLLM's own TPUWorker; on the CPU twin its PJRT-CPU subclass without aotc's build-time measuring."""
        return {"worker_cls": CPU_SERVING_WORKER} if entry.device == "cpu" else {}


ENGINE = VllmTpuEngine()
check_entry = ENGINE.check
serving_env = ENGINE.serving_env
runtime_env = ENGINE.runtime_env
engine_args = ENGINE.engine_args
serve_settings = ENGINE.serve_settings
start_engine = ENGINE.start_engine


def worker_records(llm) -> tuple[list[dict], dict[str, Any]]:
    """All ranks' measurement records; counters summed over ranks.

    Counters are the accumulated ones (see probe.Counters) plus, under
    "raw_counters", torch_xla's own values, which dynamo resets mid-run.
    """
    records: list[dict] = []
    counters: dict[str, Any] = {"raw_counters": {}}
    for rank_result in llm.collective_rpc("aotc_records"):
        records.extend(rank_result["records"])
        _add_into(counters, rank_result["counters"])
        _add_into(counters["raw_counters"], rank_result.get("raw_counters", {}))
    return records, counters


def _add_into(total: dict, values: dict) -> None:
    for name, value in values.items():
        total[name] = total.get(name, 0) + value


def vocab_size(llm) -> int:
    return llm.llm_engine.model_config.get_vocab_size()
