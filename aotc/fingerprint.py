"""The fingerprint: a sha256 over everything that changes a compiled graph or its cache key.

Read without importing the heavy packages: versions come from package metadata, flags from the
environment, model facts from the config. Two machines with the same inputs compute the same digest;
change any one input and the digest changes, so a pod never loads a cache built for another stack.
"""

from __future__ import annotations

import hashlib
import json
import functools
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from aotc.matrix import Entry

FINGERPRINT_VERSION = 1
RUNNER_PACKAGES = {"vllm-tpu": ("torch", "torch_xla", "vllm", "libtpu"),
                   "tpu-inference": ("jax", "jaxlib", "libtpu", "tpu-inference", "vllm-tpu", "torchax")}
RUNNER_ENV_VARS = {"vllm-tpu": ("VLLM_TPU_BUCKET_PADDING_GAP", "VLLM_TPU_MOST_MODEL_LEN", "VLLM_XLA_USE_SPMD",
                                "VLLM_TPU_USING_PATHWAYS"),
                   "tpu-inference": ("VLLM_TPU_BUCKET_PADDING_GAP", "VLLM_TPU_USING_PATHWAYS", "MIN_TOKEN_BUCKET",
                                     "ATTN_BUCKETIZED_NUM_REQS", "ATTN_CUSTOM_NUM_REQS_BUCKETS", "MODEL_IMPL_TYPE",
                                     "NEW_MODEL_DESIGN", "USE_BATCHED_RPA_KERNEL")}
FLAG_ENV_VARS = ("XLA_FLAGS", "LIBTPU_INIT_ARGS")
# Flags a runner's stack adds to the launch flags on import, before anything compiles: they are in the
# compiler's cache key like the pod's own (tpu_inference/env_override.py; a test pins this table to it).
RUNNER_IMPLIED_FLAGS = {"tpu-inference": {"XLA_FLAGS": ("--xla_cpu_max_isa=AVX2",),
                                          "LIBTPU_INIT_ARGS": ("--xla_tpu_use_dynamic_smem_negotiation=true",)}}
# A runner whose stack cannot share the core's venv names its interpreter here, e.g. AOTC_PYTHON_TPU_INFERENCE.
RUNNER_PYTHON_ENV = "AOTC_PYTHON_{}"


@dataclass(frozen=True)
class Fingerprint:
    digest: str
    inputs: dict[str, Any]

    @property
    def short(self) -> str:
        return self.digest[:12]


def canonical_json(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def digest_of(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(inputs)).hexdigest()


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def runner_python(runner: str, environ: dict[str, str] | None = None) -> str:
    """The interpreter a runner runs under: its AOTC_PYTHON_<RUNNER> if set, else this one."""
    environ = os.environ if environ is None else environ
    return environ.get(RUNNER_PYTHON_ENV.format(runner.upper().replace("-", "_"))) or sys.executable


def runner_versions(runner: str, environ: dict[str, str] | None = None) -> dict[str, str | None]:
    """The runner's package versions, from the metadata of the interpreter that will run it."""
    packages = RUNNER_PACKAGES[runner]
    python = runner_python(runner, environ)
    if _same_interpreter(python):
        return {pkg: package_version(pkg) for pkg in packages}
    return dict(_foreign_versions(python, packages))


def _same_interpreter(python: str) -> bool:
    try:
        return Path(python).resolve() == Path(sys.executable).resolve()
    except OSError:
        return False


_VERSIONS_SCRIPT = """import json, sys
from importlib import metadata
def v(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
json.dump({name: v(name) for name in sys.argv[1:]}, sys.stdout)
"""


@functools.lru_cache(maxsize=None)
def _foreign_versions(python: str, packages: tuple[str, ...]) -> tuple[tuple[str, str | None], ...]:
    # Metadata only, nothing imported: a ~50 ms subprocess, so plan/fingerprint stay light.
    from aotc.errors import BadInput

    try:
        out = subprocess.run([python, "-I", "-c", _VERSIONS_SCRIPT, *packages], capture_output=True, text=True,
                             timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise BadInput(f"cannot read package versions from runner interpreter {python}: {exc}") from None
    return tuple(json.loads(out).items())


def xla_flags(environ: dict[str, str], runner: str | None = None,
              entry_flags: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """The sorted ``--xla*`` flags of XLA_FLAGS and LIBTPU_INIT_ARGS, with those the runner's stack adds and
    those the runner adds for the entry (``entry_implied_flags``): they are part of XLA's cache key."""
    flags: list[str] = []
    implied = RUNNER_IMPLIED_FLAGS.get(runner or "", {})
    for var in FLAG_ENV_VARS:
        try:
            words = shlex.split(environ.get(var, ""))
        except ValueError:
            words = environ.get(var, "").split()
        words += [w for w in (*(entry_flags or {}).get(var, ()), *implied.get(var, ())) if w not in words]
        flags += [f"{var}:{w}" for w in words if w.startswith("--xla")]
    return sorted(flags)


def runner_env(entry: Entry, environ: dict[str, str]) -> dict[str, str]:
    """The runner-read variables as the build will set them: the config's value, else the process's."""
    env = {}
    for var in RUNNER_ENV_VARS[entry.runner]:
        if var in entry.env:
            env[var] = str(entry.env[var])
        elif var in environ:
            env[var] = environ[var]
    return env


def _runner_buckets(entry: Entry):
    from aotc.runners.spec import load_runner

    return load_runner(entry.runner).load("buckets")


def entry_implied_flags(entry: Entry) -> dict[str, tuple[str, ...]]:
    """Flags the runner adds for this entry (the twin's virtual device count), from its buckets module."""
    implied = getattr(_runner_buckets(entry), "implied_flags", None)
    return implied(entry) if implied else {}


def entry_mesh(entry: Entry) -> dict[str, Any] | None:
    """The device mesh the runner shards the entry's graphs over, when the runner declares one."""
    mesh = getattr(_runner_buckets(entry), "mesh", None)
    return mesh(entry) if mesh else None


def model_config_digest(entry: Entry) -> str | None:
    path = entry.model_config_path
    return hashlib.sha256(path.read_bytes()).hexdigest() if path and path.is_file() else None


def fingerprint_inputs(entry: Entry, environ: dict[str, str] | None = None) -> dict[str, Any]:
    environ = dict(os.environ if environ is None else environ)
    model_digest = model_config_digest(entry)
    inputs = {
        "fingerprint_version": FINGERPRINT_VERSION,
        # a local model is identified by its config, not by where it happens to lie on disk
        "model": os.path.basename(entry.model.rstrip("/")) if model_digest else entry.model,
        "revision": entry.revision,
        "model_config_sha256": model_digest,
        "runner": entry.runner,
        "device": entry.device,
        "accelerator": entry.accelerator,
        "dtype": entry.dtype,
        "max_model_len": entry.max_model_len,
        "max_num_seqs": entry.max_num_seqs,
        "max_num_batched_tokens": entry.max_num_batched_tokens,
        "tensor_parallel_size": entry.tensor_parallel_size,
        "engine": dict(sorted(entry.engine.items())),
        "env": runner_env(entry, environ),
        "versions": runner_versions(entry.runner, environ),
        "xla_flags": xla_flags(environ, entry.runner, entry_implied_flags(entry)),
    }
    if (mesh := entry_mesh(entry)) is not None:
        inputs["mesh"] = mesh
    return inputs


def fingerprint_entry(entry: Entry, environ: dict[str, str] | None = None) -> Fingerprint:
    inputs = fingerprint_inputs(entry, environ)
    return Fingerprint(digest_of(inputs), inputs)


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: data}


def diff_inputs(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Dotted key paths whose values differ between two input sets (missing counts as different)."""
    fa, fb = flatten(a), flatten(b)
    return sorted(k for k in fa.keys() | fb.keys() if fa.get(k, _MISSING) != fb.get(k, _MISSING))


def describe_diff(ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    fa, fb = flatten(ours), flatten(theirs)
    return [f"{k}: here {fa.get(k, '<unset>')!r}, published {fb.get(k, '<unset>')!r}" for k in diff_inputs(ours, theirs)]


_MISSING = object()


def render_fingerprint(name: str, fp: Fingerprint, console) -> None:
    from rich.table import Table

    console.print(f"[bold]{name}[/bold]  {fp.digest}")
    table = Table(show_header=True, box=None)
    table.add_column("input")
    table.add_column("value")
    for key, value in sorted(flatten(fp.inputs).items()):
        table.add_row(key, json.dumps(value))
    console.print(table)
