"""The KV block count tpu-inference gives an entry when nothing pins it: its own memory sizing, nothing else.

Run as ``python -m aotc.runners.tpu_inference.kv_sizer`` under the runner's interpreter with the entry
(``Entry.to_dict()``, without ``num_gpu_blocks_override``) as JSON on stdin (aotc/runners/kv_sizing.py). It
starts the in-process engine as a build does; the worker's ``determine_available_memory`` fills the HBM
after the weights × ``gpu_memory_utilization`` (on the CPU twin the twin's stated HBM, twin/).
"""

from __future__ import annotations

import sys
import tempfile
from aotc.entry import Entry
from aotc.runners.kv_sizing import main, sized_by

from .twin import HBM_BYTES_ENV

# What the sizing reads besides the fingerprint's inputs (aotc/kv.py keys its answers on them too).
SIZING_ENV = (HBM_BYTES_ENV,)


def size_kv(entry: Entry) -> int:
    from .engine import start_engine

    with tempfile.TemporaryDirectory(prefix="aotc-kv-size-") as cache_dir:
        return sized_by(lambda before_start: start_engine(entry, cache_dir, before_start), entry)


if __name__ == "__main__":
    sys.exit(main(size_kv))
