"""``aotc doctor``: what this machine would build with, and whether its XLA cache can really load.

Every registered runner is reported (its interpreter, its stack's versions, the env vars and XLA flags set
here); the default runner runs on this interpreter, so its stack must be complete. The loadability probe
is the default runner's own (``RunnerSpec.loadability_probe``), run only when its stack is installed.
"""

from __future__ import annotations

import os
import platform
from typing import Any

from aotc import __version__
from aotc.errors import BadInput
from aotc.runners.flags import xla_flags
from aotc.runners.spec import runner_python, runner_versions
from aotc.runners.spec import DEFAULT_RUNNER, RunnerSpec, load_runner, registered

# present only where TPU hardware is (a CPU-only machine builds on the twin without it)
HOST_PACKAGES = ("libtpu",)


def runner_inputs(spec: RunnerSpec, environ: dict[str, str]) -> dict[str, Any]:
    try:
        versions: dict[str, Any] = runner_versions(spec.name, environ)
    except BadInput as exc:
        versions = {pkg: None for pkg in spec.packages} | {"error": str(exc)}
    return {"python": runner_python(spec.name, environ), "versions": versions,
            "env": {v: environ[v] for v in spec.env_vars if v in environ},
            "xla_flags": xla_flags(environ, spec.name)}


def environment_inputs(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Per runner: its interpreter, its stack's versions, the runner env vars and XLA flags set here."""
    environ = dict(os.environ if environ is None else environ)
    return {name: runner_inputs(spec, environ) for name, spec in sorted(registered().items())}


def tpu_targets(runners: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per runner whose stack is installed and compiles for a TPU without one: the topologies it can target."""
    targets = {}
    for name in runners:
        spec = load_runner(name)
        if spec.tpu_targets_on_cpu_host and "error" not in runners[name]["versions"]:
            targets[name] = spec.tpu_targets()
    return targets


def run_doctor(probe: bool = True) -> dict[str, Any]:
    runners = environment_inputs()
    report: dict[str, Any] = {
        "aotc_version": __version__, "python": platform.python_version(), "machine": platform.machine(),
        "runners": runners, "pjrt_device": os.environ.get("PJRT_DEVICE"), "default_runner": DEFAULT_RUNNER,
    }
    # this interpreter runs the default runner; other runners are reported, not required
    missing = [p for p, v in runners[DEFAULT_RUNNER]["versions"].items() if v is None and p not in HOST_PACKAGES]
    report["full_stack"] = not missing
    report["problems"] = [f"{DEFAULT_RUNNER}: not installed: {', '.join(missing)} (build/verify need the full "
                          "stack: make env)"] if missing else []
    for runner, info in runners.items():
        if runner != DEFAULT_RUNNER and "error" in info["versions"]:
            hint = f"{load_runner(runner).python_env} names its interpreter"
            report["problems"].append(f"{runner}: {info['versions']['error']} ({hint})")
    report["tpu_targets"] = tpu_targets(runners)
    spec = load_runner(DEFAULT_RUNNER)
    if probe and not missing and (loadability := spec.loadability_probe()) is not None:
        report["loadability"] = loadability
    report["ok"] = not missing
    return report
