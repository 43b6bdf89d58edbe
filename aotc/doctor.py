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
from aotc.errors import BadInput
from aotc.fingerprint import RUNNER_ENV_VARS, RUNNER_PACKAGES, runner_python, runner_versions, xla_flags

CORE_RUNNER = "vllm-tpu"
COUNTERS = ("PersistentCacheMiss", "PersistentCacheHit", "PersistentCacheLoad", "PersistentCacheDeserializeFailure",
            "UncachedCompile", "CachedCompile")


def environment_inputs(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Per runner: its interpreter, its stack's versions, the runner env vars and XLA flags set here."""
    environ = dict(os.environ if environ is None else environ)
    runners: dict[str, Any] = {}
    for runner, env_vars in RUNNER_ENV_VARS.items():
        try:
            versions: dict[str, Any] = runner_versions(runner, environ)
        except BadInput as exc:
            versions = {pkg: None for pkg in RUNNER_PACKAGES[runner]} | {"error": str(exc)}
        runners[runner] = {"python": runner_python(runner, environ), "versions": versions,
                           "env": {v: environ[v] for v in env_vars if v in environ},
                           "xla_flags": xla_flags(environ, runner)}
    return runners


def run_doctor(probe: bool = True) -> dict[str, Any]:
    runners = environment_inputs()
    report: dict[str, Any] = {
        "aotc_version": __version__, "python": platform.python_version(), "machine": platform.machine(),
        "runners": runners, "pjrt_device": os.environ.get("PJRT_DEVICE"),
    }
    # this interpreter runs the torch_xla runner; other runners are reported, not required
    missing = [p for p, v in runners[CORE_RUNNER]["versions"].items() if v is None and p != "libtpu"]
    report["full_stack"] = not missing
    report["problems"] = [f"{CORE_RUNNER}: not installed: {', '.join(missing)} (build/verify need the full "
                          "stack: make env)"] if missing else []
    for runner, info in runners.items():
        if runner != CORE_RUNNER and "error" in info["versions"]:
            report["problems"].append(f"{runner}: {info['versions']['error']} (make env-jax)")
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
    for runner, info in report["runners"].items():
        console.print(f"runner {runner} ({info['python']})")
        for name, version in info["versions"].items():
            if name != "error":
                console.print(f"  {name:14} {version or '[dim]not installed[/dim]'}")
        console.print(f"  runner env: {info['env'] or '{}'}")
        console.print(f"  xla flags:  {info['xla_flags'] or '[]'}")
    for problem in report.get("problems", []):
        console.print(f"[red]{problem}[/red]")
    probe = report.get("loadability")
    if probe:
        console.print(f"loadability probe ({CORE_RUNNER}): {probe['verdict']}")
        console.print(f"  first process:  {probe['first_process']}")
        console.print(f"  second process: {probe['second_process']}")


if __name__ == "__main__":
    _probe_main(sys.argv[1])
