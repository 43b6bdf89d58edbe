"""vLLM's TpuPlatform, running on PJRT CPU.

Only what needs a real TPU changes: the device name (tpu_info would probe PCI),
the attention backend (Pallas kernels), and the default worker. Everything else
— bucket rules, block size, compilation mode — is vLLM's TPU logic unchanged.
"""

from __future__ import annotations

import os

from vllm.platforms.tpu import TpuPlatform

ATTENTION_BACKEND = "aotc.runners.vllm_tpu.twin.attention.TwinPallasAttentionBackend"
WORKER_CLS = "aotc.runners.vllm_tpu.worker.CpuTwinServingWorker"  # a plain `vllm serve` on the twin
# Set by the runner from the entry's accelerator, e.g. "v6e-8" -> "TPU V6E".
DEVICE_NAME_ENV = "AOTC_TWIN_DEVICE_NAME"


class CpuTwinTpuPlatform(TpuPlatform):
    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return os.environ.get(DEVICE_NAME_ENV, "TPU V6E")

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config) -> str:
        super().get_attn_backend_cls(selected_backend, attn_selector_config)
        return ATTENTION_BACKEND

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        if vllm_config.parallel_config.worker_cls == "auto":
            vllm_config.parallel_config.worker_cls = WORKER_CLS
        super().check_and_update_config(vllm_config)
