"""vLLM's TPUWorker with per-call measurement, and its PJRT-CPU twin.

`AotcTPUWorker` changes nothing vLLM does; it wraps the runner's own
`capture_model` steps and the runtime step so every cache file can be tied to
the call (family + shape) that first wrote it. `CpuTwinWorker` additionally
keeps the XLA runtime on the CPU and replaces the HBM query with a fixed budget.
The driver reads the measurements back with `collective_rpc("aotc_records")`,
which works the same in-process (tp=1) and across worker processes.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any
from unittest import mock

import vllm.envs as envs
from vllm.v1.worker import tpu_model_runner as tmr
from vllm.v1.worker.tpu_worker import TPUWorker

from aotc.runners.protocol import report_progress

from .probe import STDERR_LOG_ENV, Probe

# capture_model's steps, in vLLM's order, under the plan's family names.
PRECOMPILE_FAMILIES = (
    ("_precompile_mm_encoder", "mm_encoder"),
    ("_precompile_backbone", "backbone"),
    ("_precompile_select_hidden_states", "select_hidden_states"),
    ("_precompile_compute_logits", "compute_logits"),
    ("_precompile_structured_decoding", "structured_decoding"),
    ("_precompile_sample_from_logits", "sample_from_logits"),
    ("_precompile_gather_logprobs", "gather_logprobs"),
)


def _backbone_shape(num_tokens, num_reqs, num_blocks):
    return {"num_tokens": num_tokens, "num_reqs": num_reqs, "num_blocks": num_blocks}


def _select_shape(hidden_states, indices):
    return {"num_tokens": int(hidden_states.shape[0]), "num_reqs": int(indices.shape[0])}


def _reqs_of(position: int) -> Callable[..., dict]:
    return lambda *args: {"num_reqs": int(args[position].shape[0])}


def _sample_shape(logits, metadata):
    return {"num_reqs": int(logits.shape[0]), "all_greedy": bool(metadata.all_greedy)}


# Runner attribute -> (family, shape from the call's positional arguments).
GRAPH_CALLS: dict[str, tuple[str, Callable[..., dict]]] = {
    "_dummy_run": ("backbone", _backbone_shape),
    "select_hidden_states": ("select_hidden_states", _select_shape),
    "compute_logits": ("compute_logits", _reqs_of(0)),
    "structured_decode": ("structured_decoding", _reqs_of(2)),
    "sample_from_logits_func": ("sample_from_logits", _sample_shape),
    "gather_logprobs": ("gather_logprobs", _reqs_of(0)),
}


def _embedded_items(input_ids, mm_embed_inputs=None) -> dict:
    """_get_model_inputs's shape: the padded token count and how many items' embeddings it merges in."""
    items = _count_items(mm_embed_inputs[0]) if mm_embed_inputs else 0
    return {"num_tokens": int(input_ids.shape[0]), "num_items": items}


def _count_items(embeddings) -> int:
    """Items in vLLM's nested multimodal embeddings: a [items, rows, hidden] tensor or an item's [rows, hidden]."""
    if hasattr(embeddings, "dim"):
        return int(embeddings.shape[0]) if embeddings.dim() == 3 else 1
    return sum(_count_items(e) for e in embeddings)


def _encoded_items(**mm_kwargs) -> dict:
    """embed_multimodal's shape: the items of its batched inputs (each input tensor leads with the items)."""
    batched = [v for v in mm_kwargs.values() if hasattr(v, "shape")]
    return {"num_items": int(batched[0].shape[0]) if batched else len(next(iter(mm_kwargs.values()), []))}


# Lazy-tensor calls of a multimodal model, which compile at the torch_xla.sync the runner makes right after each
# call (everywhere it calls them): measured with that sync inside the window. Runner or model attribute ->
# (family, shape of the call).
LAZY_MM_CALLS: dict[str, tuple[str, Callable[..., dict]]] = {
    "_get_model_inputs": ("embed_inputs", _embedded_items),
}
LAZY_MODEL_CALLS: dict[str, tuple[str, Callable[..., dict]]] = {
    "embed_multimodal": ("mm_encoder", _encoded_items),
}


def _wait_device() -> None:
    # Waits for queued executions only; unlike torch_xla.sync() it cannot cut
    # a lazy graph differently from an uninstrumented run.
    import torch_xla.core.xla_model as xm

    xm.wait_device_ops()


class AotcTPUWorker(TPUWorker):
    probe: Probe | None = None
    _scheduled: tuple[int, int] = (0, 0)

    def init_device(self) -> None:
        super().init_device()
        if envs.VLLM_XLA_CACHE_PATH:
            import torch_xla.runtime as xr

            subdir = f"tp{self.parallel_config.world_size}_rank{xr.global_ordinal()}"
            os.makedirs(os.path.join(envs.VLLM_XLA_CACHE_PATH, subdir), exist_ok=True)
            # Ranks share the inherited stderr file; one reader avoids counting
            # every warning once per rank.
            log = os.environ.get(STDERR_LOG_ENV) if self.rank == 0 else None
            self.probe = Probe(envs.VLLM_XLA_CACHE_PATH, subdir, _wait_device, log)

    def _measured(self, kind: str, family: str, fn: Callable, *args, **kwargs):
        if self.probe is None:
            return fn(*args, **kwargs)
        with self.probe.window(kind, family):
            return fn(*args, **kwargs)

    def load_model(self) -> None:
        self._measured("phase", "load_model", super().load_model)

    def determine_available_memory(self) -> int:
        return self._measured("phase", "profile_run", super().determine_available_memory)

    def initialize_from_config(self, kv_cache_config) -> None:
        self._measured("phase", "kv_cache", super().initialize_from_config, kv_cache_config)

    def compile_or_warm_up_model(self) -> None:
        if self.probe is not None:
            self._instrument_runner()
            self.probe.phase = "capture"
        try:
            self._measured("phase", "capture_model", super().compile_or_warm_up_model)
        finally:
            if self.probe is not None:
                self.probe.phase = "runtime"

    def execute_model(self, scheduler_output):
        self._scheduled = (
            len(scheduler_output.num_scheduled_tokens),
            scheduler_output.total_num_scheduled_tokens,
        )
        return self._step("execute_model", super().execute_model, scheduler_output)

    def sample_tokens(self, grammar_output):
        return self._step("sample_tokens", super().sample_tokens, grammar_output)

    def aotc_records(self) -> dict[str, Any]:
        """Everything measured so far, plus files no window saw (RPC target)."""
        if self.probe is None:
            return {"records": [], "counters": {}}
        records = [r.as_dict() for r in self.probe.records]
        records.append(self.probe.unattributed().as_dict())
        return {"records": records, "counters": self.probe.counters.read(), "raw_counters": _raw_counters()}

    def _step(self, what: str, fn: Callable, arg):
        if self.probe is None:
            return fn(arg)
        with self.probe.window("step", "runtime") as shape:
            result = fn(arg)
            shape.update(_step_shape(self.model_runner, what, *self._scheduled))
            return result

    def _instrument_runner(self) -> None:
        runner = self.model_runner
        for attr, family in PRECOMPILE_FAMILIES:
            setattr(runner, attr, self._wrap(getattr(runner, attr), "family", family, None))
        for attr, (family, shape_of) in GRAPH_CALLS.items():
            setattr(runner, attr, self._wrap(getattr(runner, attr), "call", family, shape_of))
        if runner.supports_mm_inputs:
            for owner, calls in ((runner, LAZY_MM_CALLS), (runner.model, LAZY_MODEL_CALLS)):
                for attr, (family, shape_of) in calls.items():
                    setattr(owner, attr, self._wrap(getattr(owner, attr), "call", family, shape_of, synced=True))

    def _wrap(self, fn: Callable, kind: str, family: str, shape_of: Callable | None, synced: bool = False):
        probe = self.probe

        @functools.wraps(fn)
        def measured(*args, **kwargs):
            shape = shape_of(*args, **kwargs) if shape_of else {}
            started = time.perf_counter()
            with probe.window(kind, family, shape):
                result = fn(*args, **kwargs)
                if synced:
                    import torch_xla

                    torch_xla.sync(wait=False)
            if kind == "family":
                report_progress(family, time.perf_counter() - started)
            return result

        return measured


def _raw_counters() -> dict[str, int]:
    import torch_xla.debug.metrics as met

    return {name: met.counter_value(name) for name in met.counter_names()}


def _step_shape(runner, what: str, num_reqs: int, num_tokens: int) -> dict[str, Any]:
    """Shape and sampling mix of a runtime step, padded the way the runner pads."""
    batch = runner.input_batch
    sampling = "greedy" if batch.all_greedy else "random" if batch.all_random else "greedy+random"
    return {
        "what": what,
        "num_reqs": num_reqs,
        "padded_num_reqs": tmr._get_padded_num_reqs_with_upper_limit(max(num_reqs, 1), runner.max_num_reqs),
        "num_tokens": num_tokens,
        "padded_num_tokens": tmr._get_padded_token_len(runner.num_tokens_paddings, max(num_tokens, 1)),
        "sampling": sampling,
        "logprobs": bool(batch.max_num_logprobs),
    }


class CpuTwin:
    """The TPU worker on PJRT CPU: same runner, same graphs, no TPU (a mixin before a TPUWorker).

    It also gives torch_xla's Pallas grouped matmul (vLLM's TPU MoE) its CPU kernel (twin.moe), and its Pallas
    flash attention (vLLM's vision encoders) its CPU twin (twin.attention.flash_attention).
    """

    def init_device(self) -> None:
        # TPUWorker.init_device sets PJRT_DEVICE=TPU before touching the
        # runtime; creating the client first pins it to the CPU.
        os.environ["PJRT_DEVICE"] = "CPU"
        import torch_xla

        from .twin.attention import install_vision_attention
        from .twin.moe import install as install_twin_moe

        torch_xla.device()
        # Here, not in the platform: only the engine's worker may import torch_xla (the API server must not).
        install_twin_moe()
        install_vision_attention()
        super().init_device()

    def determine_available_memory(self) -> int:
        import torch_xla.core.xla_model as xm

        from .kv_sizer import DEFAULT_HBM_BYTES, HBM_BYTES_ENV

        # vLLM's own profiling run and arithmetic; only the HBM query, which the CPU client cannot answer,
        # reports the twin's stated HBM with the loaded weights in use, as a TPU's does after loading.
        hbm = {"bytes_limit": int(os.environ.get(HBM_BYTES_ENV) or DEFAULT_HBM_BYTES),
               "bytes_used": self._weight_bytes()}
        with mock.patch.object(xm, "get_memory_info", lambda device: hbm):
            available = super().determine_available_memory()
        pinned = self.cache_config.num_gpu_blocks_override
        # vLLM takes a pinned count whatever memory is reported: report enough for it on the twin
        return max(available, pinned * self._bytes_per_block()) if pinned else available

    def _weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model_runner.model.parameters())

    def _bytes_per_block(self) -> int:
        return sum(spec.page_size_bytes for spec in self.model_runner.get_kv_cache_spec().values())


class CpuTwinWorker(CpuTwin, AotcTPUWorker):
    """The CPU twin with aotc's build-time measuring (build and verify)."""


class CpuTwinServingWorker(CpuTwin, TPUWorker):
    """The CPU twin as a pod runs it under the stock `vllm serve`: vLLM's worker, nothing measured."""
