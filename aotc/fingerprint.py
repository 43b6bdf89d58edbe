"""The fingerprint: a sha256 over everything that changes a compiled graph or its cache key.

Read without importing the heavy packages: versions come from package metadata, flags from the
environment, model facts from the config. Two machines with the same inputs compute the same digest;
change any one input and the digest changes, so a pod never loads a cache built for another stack.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import functools
import os
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from aotc.engine_args import graph_args
from aotc.files import sha256_file
from aotc.matrix import Entry
from aotc.runners.flags import collapse_words
from aotc.runners.spec import load_runner

# 2: flags hashed as JAX hashes them (every word, duplicates kept, the stack's own additions once per
#    process of a stock server); the pinned KV block count; versions from the runner's pins without its venv.
# 3: the stack's own additions once in every process layout (aotc's vLLM plugin collapses them).
FINGERPRINT_VERSION = 3
FLAG_ENV_VARS = ("XLA_FLAGS", "LIBTPU_INIT_ARGS")


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
    """The interpreter a runner runs under: its ``RunnerSpec.python_env`` (AOTC_PYTHON_<RUNNER>) if set, else
    this one (a stack that cannot share the core's venv gets its own)."""
    environ = os.environ if environ is None else environ
    return environ.get(load_runner(runner).python_env) or sys.executable


def runner_versions(runner: str, environ: dict[str, str] | None = None) -> dict[str, str | None]:
    """The runner's package versions, from the metadata of the interpreter that will run it.

    Where that stack is not installed at all (this interpreter lacks its packages and no
    AOTC_PYTHON_<RUNNER> names another, e.g. a fetch init container), the versions this aotc pins for the
    runner stand in: the stack a pod may serve with is the pinned one, and the guard in the running engine
    compares the real versions with the manifest's."""
    spec = load_runner(runner)
    python = runner_python(runner, environ)
    if not _same_interpreter(python):
        return dict(_foreign_versions(python, spec.packages))
    found = {pkg: package_version(pkg) for pkg in spec.packages}
    if spec.pins and None in found.values():
        return {pkg: spec.pins.get(pkg) for pkg in spec.packages}
    return found


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
    """The words of XLA_FLAGS and LIBTPU_INIT_ARGS as JAX's cache key hashes them (jax/_src/cache_key.py,
    ``_hash_xla_flags``): split on whitespace, sorted, duplicates kept.

    With ``runner``, ``environ`` is a launch environment and the result what any process of a server or an
    in-process engine hashes: the flags the runner's stack prepends at import (``RunnerSpec.implied_flags``)
    once each, however many of its processes imported it, because aotc's vLLM plugin collapses them
    (aotc/runners/flags.py); ``entry_flags`` (``entry_implied_flags``: the twin's virtual device count) are
    set once in the launch environment, unless it holds them already. Without ``runner``: the words of
    ``environ`` as they are (a live process's). Stricter than JAX in one way: its dump-only flags count here too."""
    implied = load_runner(runner).implied_flags if runner else {}
    flags: list[str] = []
    for var in FLAG_ENV_VARS:
        launch = environ.get(var, "").split()
        launch += [w for w in (entry_flags or {}).get(var, ()) if w not in launch]
        own = implied.get(var, ())
        flags += [f"{var}:{w}" for w in collapse_words([*own, *launch], own)]
    return sorted(flags)


def runner_env(entry: Entry, environ: dict[str, str]) -> dict[str, str]:
    """The runner-read variables as the build will set them: the config's value, else what the runner
    implies for the entry (its buckets module's ``implied_env``), else the process's."""
    implied_env = getattr(_runner_buckets(entry), "implied_env", None)
    implied = implied_env(entry) if implied_env else {}
    env = {}
    for var in load_runner(entry.runner).env_vars:
        if var in entry.env:
            env[var] = str(entry.env[var])
        elif var in implied:
            env[var] = implied[var]
        elif var in environ:
            env[var] = environ[var]
    return env


def _runner_buckets(entry: Entry):
    return load_runner(entry.runner).load("buckets")


def kv_blocks(entry: Entry) -> int | None:
    """The KV-cache page count the runner pins (a shape in its graphs); None for a runner without one."""
    rule = getattr(_runner_buckets(entry), "kv_blocks", None)
    return rule(entry) if rule else None


def entry_implied_flags(entry: Entry) -> dict[str, tuple[str, ...]]:
    """Flags the runner adds for this entry (the twin's virtual device count), from its buckets module."""
    implied = getattr(_runner_buckets(entry), "implied_flags", None)
    return implied(entry) if implied else {}


def entry_mesh(entry: Entry) -> dict[str, Any] | None:
    """The device mesh the runner shards the entry's graphs over, when the runner declares one."""
    mesh = getattr(_runner_buckets(entry), "mesh", None)
    return mesh(entry) if mesh else None


def code_digest(modules: tuple[str, ...]) -> str:
    """sha256 over the modules' source files, found by path and never imported (a twin module imports its
    stack). The bytes, not a parse: the guard and the runner compute this under other Python versions."""
    lines = (f"{name} {sha256_file(importlib.util.find_spec(name).origin)[0]}\n" for name in modules)
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def twin_digest(entry: Entry) -> str | None:
    """The CPU twin's code in the entry's graphs (``RunnerSpec.twin_modules``); None off the twin."""
    modules = load_runner(entry.runner).twin_modules
    return code_digest(modules) if entry.device == "cpu" and modules else None


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
        # every vllm serve argument the matrix set, but those a pod chooses freely (aotc/engine_args.py)
        "engine": graph_args(entry.engine),
        # a shape in every backbone graph; the serving flags pin it (aotc/server.py)
        "kv_blocks": kv_blocks(entry),
        "env": runner_env(entry, environ),
        "versions": runner_versions(entry.runner, environ),
        "xla_flags": xla_flags(environ, entry.runner, entry_flags=entry_implied_flags(entry)),
    }
    if (mesh := entry_mesh(entry)) is not None:
        inputs["mesh"] = mesh
    if (twin := twin_digest(entry)) is not None:
        inputs["twin"] = twin
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
