"""``aotc doctor``'s loadability probe for torch_xla (RunnerSpec.loadability_probe): can this stack load its own cache?

One tiny graph is compiled into a temporary persistent cache in one process and run again in a second:
on a stack that can load, the second process records a hit/load; on torch_xla 2.9.0 it records a
deserialize failure and compiles again (pytorch/xla#9094).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

COUNTERS = ("PersistentCacheMiss", "PersistentCacheHit", "PersistentCacheLoad", "PersistentCacheDeserializeFailure",
            "UncachedCompile", "CachedCompile")


def loadability_probe(timeout: float = 300) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="aotc-doctor-") as cache:
        runs = [_probe_process(cache, timeout) for _ in range(2)]
        files = sorted(p.name for p in Path(cache).iterdir())
    first, second = runs
    loaded = (second.get("PersistentCacheHit") or 0) + (second.get("PersistentCacheLoad") or 0)
    failed = second.get("PersistentCacheDeserializeFailure") or 0
    written = bool(files) and (first.get("PersistentCacheMiss") or 0) > 0
    found = (second.get("PersistentCacheMiss") or 0) == 0
    loadable = loaded > 0 and failed == 0
    if "error" in first or "error" in second:
        verdict = f"probe failed: {first.get('error') or second.get('error')}"
    elif loadable:
        verdict = "the persistent cache loads: a second process reused the compiled graph"
    elif written and found:
        verdict = ("cache entries are written and found, but cannot be loaded on this stack "
                   "(deserialize failures: %d; pytorch/xla#9094): aotc can prove coverage, not load" % failed)
    else:
        verdict = "the persistent cache did not work as expected; see the counters"
    return {"first_process": first, "second_process": second, "cache_files": len(files), "written": written,
            "found": found, "loadable": loadable, "verdict": verdict}


def _probe_process(cache: str, timeout: float) -> dict[str, Any]:
    env = {**os.environ, "PJRT_DEVICE": os.environ.get("PJRT_DEVICE", "CPU")}
    proc = subprocess.run([sys.executable, "-m", __name__, cache], capture_output=True, text=True, env=env,
                          timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
    return json.loads(lines[-1])


def _probe_main(cache: str) -> None:
    import torch
    import torch_xla
    import torch_xla.debug.metrics as met
    import torch_xla.runtime as xr

    xr.initialize_cache(cache, readonly=False)
    values = torch.arange(64, dtype=torch.float32, device="xla")
    result = (values.reshape(8, 8) @ values.reshape(8, 8).T).sum()
    torch_xla.sync()
    result.item()
    print(json.dumps({name: met.counter_value(name) for name in COUNTERS}))


if __name__ == "__main__":
    _probe_main(sys.argv[1])
