"""``aotc doctor``: what this machine would build with, and whether its XLA cache can really load.

The loadability probe compiles one tiny graph into a temporary persistent cache in one process and
runs it again in a second: on a stack that can load, the second process records a hit/load; on
torch_xla 2.9.0 it records a deserialize failure and compiles again (pytorch/xla#9094).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from aotc import __version__
from aotc.fingerprint import RUNNER_ENV_VARS, RUNNER_PACKAGES, package_version, xla_flags

COUNTERS = ("PersistentCacheMiss", "PersistentCacheHit", "PersistentCacheLoad", "PersistentCacheDeserializeFailure",
            "UncachedCompile", "CachedCompile")


def environment_inputs(environ: dict[str, str] | None = None) -> dict[str, Any]:
    environ = dict(os.environ if environ is None else environ)
    packages = sorted({p for pkgs in RUNNER_PACKAGES.values() for p in pkgs})
    env_vars = sorted({v for vs in RUNNER_ENV_VARS.values() for v in vs})
    return {"versions": {p: package_version(p) for p in packages},
            "env": {v: environ[v] for v in env_vars if v in environ},
            "xla_flags": xla_flags(environ)}


def run_doctor(probe: bool = True) -> dict[str, Any]:
    report: dict[str, Any] = {
        "aotc_version": __version__, "python": platform.python_version(), "machine": platform.machine(),
        "environment": environment_inputs(),
        "pjrt_device": os.environ.get("PJRT_DEVICE"),
    }
    missing = [p for p, v in report["environment"]["versions"].items() if v is None and p != "libtpu"]
    report["full_stack"] = not missing
    if missing:
        report["problems"] = [f"not installed: {', '.join(missing)} (build/verify need the full stack: make env)"]
    if probe and not missing:
        report["loadability"] = loadability_probe()
    report["ok"] = not missing
    return report


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
    proc = subprocess.run([sys.executable, "-m", "aotc.doctor", cache], capture_output=True, text=True, env=env,
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


def render_doctor(report: dict[str, Any], console) -> None:
    console.print(f"aotc {report['aotc_version']} on Python {report['python']} ({report['machine']})")
    for name, version in report["environment"]["versions"].items():
        console.print(f"  {name:10} {version or '[dim]not installed[/dim]'}")
    console.print(f"  runner env: {report['environment']['env'] or '{}'}")
    console.print(f"  xla flags:  {report['environment']['xla_flags'] or '[]'}")
    for problem in report.get("problems", []):
        console.print(f"[red]{problem}[/red]")
    probe = report.get("loadability")
    if probe:
        console.print(f"loadability probe: {probe['verdict']}")
        console.print(f"  first process:  {probe['first_process']}")
        console.print(f"  second process: {probe['second_process']}")


if __name__ == "__main__":
    _probe_main(sys.argv[1])
