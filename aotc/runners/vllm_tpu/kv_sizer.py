"""The KV block count vLLM 0.13's TPU worker gives an entry when nothing pins it: its own memory sizing.

Run as ``python -m aotc.runners.vllm_tpu.kv_sizer`` under the runner's interpreter with the entry
(``Entry.to_dict()``, without ``num_gpu_blocks_override``) as JSON on stdin (aotc/runners/kv_sizing.py). It
starts the in-process engine as a build does; ``TPUWorker.determine_available_memory`` runs its profiling
pass and fills the HBM torch_xla reports (× ``gpu_memory_utilization``, less the weights and 2 %); on the CPU
twin torch_xla reports the twin's stated HBM and the loaded weights (worker.py ``CpuTwin``).
"""

from __future__ import annotations

import sys
import tempfile
from aotc.entry import Entry
from aotc.runners.kv_sizing import main, sized_by

# The CPU twin's stated per-device HBM, all of it free but the weights (default 64 MiB, as the JAX twin's).
HBM_BYTES_ENV = "AOTC_TORCH_XLA_CPU_HBM_BYTES"
DEFAULT_HBM_BYTES = 64 << 20
# What the sizing reads besides the fingerprint's inputs (aotc/kv.py keys its answers on them too).
SIZING_ENV = (HBM_BYTES_ENV,)
SIZING_SEED = 0


def size_kv(entry: Entry) -> int:
    from .engine import start_engine

    with tempfile.TemporaryDirectory(prefix="aotc-kv-size-") as cache_dir:
        return sized_by(lambda before_start: start_engine(entry, cache_dir, SIZING_SEED, before_start), entry)


if __name__ == "__main__":
    sys.exit(main(size_kv))
