"""Entry -> process environment and vLLM engine arguments.

`device: tpu` is vLLM's own start-up with VLLM_XLA_CACHE_PATH at the staging
dir (vLLM writes `tp<N>_rank<r>/` under it) and the measuring worker.
`device: cpu` is the same plus the CPU-twin platform plugin, which vLLM only
activates when AOTC_CPU_TWIN=1.
"""

from __future__ import annotations

import os
import time
from typing import Any

from aotc.entry import Entry
from aotc.runners.engine_common import apply_env, llm_args
from aotc.runners.engine_common import engine_args as common_engine_args
from aotc.runners.multimodal import entry_is_multimodal

from .twin.plugin import ENV_FLAG as TWIN_FLAG

TPU_WORKER = "aotc.runners.vllm_tpu.worker.AotcTPUWorker"
CPU_WORKER = "aotc.runners.vllm_tpu.worker.CpuTwinWorker"
CPU_SERVING_WORKER = "aotc.runners.vllm_tpu.worker.CpuTwinServingWorker"
SERVE_SEED = 0  # vLLM's default; torch_xla's graphs do not depend on it (verify runs seed 1)
DEVICE_NAME_ENV = "AOTC_TWIN_DEVICE_NAME"  # read by twin.platform


def device_name(accelerator: str) -> str:
    """'v6e-8' -> 'TPU V6E', the name tpu_info would report for that chip."""
    return "TPU " + accelerator.split("-", 1)[0].upper()


def check_entry(entry: Entry) -> None:
    if entry.device not in ("cpu", "tpu"):
        raise ValueError(f"unknown device {entry.device!r}")
    if entry.device == "cpu" and entry.tensor_parallel_size != 1:
        # Each rank would get its own PJRT CPU client with ordinal 0, so ranks
        # would share tp<N>_rank0 and no collective would run: not a TPU's graphs.
        raise ValueError("device cpu supports tensor_parallel_size 1 only")


def local_model(entry: Entry) -> str | None:
    """The local model dir: the matrix's resolved model_path (its ``model`` is relative to the matrix
    file, not to this process), else ``model`` itself when it is a directory."""
    if entry.model_path:
        return entry.model_path
    return entry.model if os.path.isdir(entry.model) else None


def serving_env(entry: Entry, cache_dir: str) -> dict[str, str | None]:
    """What a pod (the stock `vllm serve`) needs besides the matrix's env: None = unset."""
    check_entry(entry)
    env: dict[str, str | None] = {
        "VLLM_XLA_CACHE_PATH": cache_dir,
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    if local_model(entry):
        env["HF_HUB_OFFLINE"] = "1"
    if entry.device == "cpu":
        env.update(
            {
                TWIN_FLAG: "1",
                "PJRT_DEVICE": "CPU",
                DEVICE_NAME_ENV: device_name(entry.accelerator),
                # Single-host gloo rendezvous; keeps the twin off the network.
                "VLLM_HOST_IP": "127.0.0.1",
            }
        )
    else:
        # Never let the twin platform activate on a real TPU host.
        env[TWIN_FLAG] = None
    return env


def runtime_env(entry: Entry, cache_dir: str) -> dict[str, str | None]:
    """Variables to set (None = unset) before vLLM is imported, for aotc's in-process build and verify."""
    env = serving_env(entry, cache_dir)
    # In-process engine: the driver reads the worker through collective_rpc and the whole start-up is
    # one process to measure.
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return env


def engine_args(entry: Entry, seed: int) -> dict[str, Any]:
    local = local_model(entry)
    # The KV cache's page count (a shape in every backbone graph) comes pinned in the entry's engine
    # arguments (aotc/fingerprint.py: pin_kv), so build, verify and pods agree.
    return common_engine_args(entry, local or entry.model, bool(local), seed,
                              worker_cls=CPU_WORKER if entry.device == "cpu" else TPU_WORKER)


def serve_settings(entry: Entry, cache_dir: str) -> tuple[dict[str, Any], dict[str, str | None]]:
    """RunnerSpec.serve: the stock `vllm serve`'s engine arguments and environment for this entry.

    vLLM's own TPUWorker; on the CPU twin its PJRT-CPU subclass without aotc's build-time measuring."""
    args = engine_args(entry, SERVE_SEED)
    if entry.device == "cpu":
        args["worker_cls"] = CPU_SERVING_WORKER
    else:
        del args["worker_cls"]
    return args, serving_env(entry, cache_dir)


def start_engine(entry: Entry, cache_dir: str, seed: int, before_start=None):
    """Start vLLM in-process; returns (llm, seconds). `before_start` runs after the env is set."""
    apply_env(runtime_env(entry, cache_dir))
    if before_start is not None:
        before_start()
    started = time.perf_counter()
    from vllm import LLM

    # Prompts are token ids here; the tokenizer changes no graph. A multimodal model's input processor needs it
    # (it expands each image placeholder to the image's tokens): vLLM refuses skip_tokenizer_init there.
    llm = LLM(**llm_args(engine_args(entry, seed)), skip_tokenizer_init=not entry_is_multimodal(entry),
              disable_log_stats=True)
    return llm, time.perf_counter() - started


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
