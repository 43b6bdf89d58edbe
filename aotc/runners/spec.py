"""The runner interface: all the core knows of a backend, found by name through the entry-point group
``aotc.runners`` (the way fsspec finds a filesystem by protocol). A backend is one package that exposes a
``RunnerSpec`` and registers it; no core module names a runner. See docs/design.md, "Runner interface".

Everything here is import-light: a spec names modules by string, imported on first use.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

ENTRY_POINT_GROUP = "aotc.runners"
# The matrix's runner when it names none (docs/design.md, "Matrix"): the first backend aotc had.
DEFAULT_RUNNER = "vllm-tpu"


@dataclass(frozen=True)
class RunnerSpec:
    name: str
    """The matrix's ``runner:`` value, e.g. ``vllm-tpu``."""
    module: str
    """Run as ``python -m <module> {build|verify} REQUEST.json RESULT.json`` (aotc/runners/protocol.py)."""
    buckets: str
    """Module with ``capture_plan(entry, hf_config)`` and ``bucket_summary(entry)``; imports no heavy stack."""
    packages: tuple[str, ...]
    """Distributions whose versions enter the fingerprint (read from metadata, never imported)."""
    env_vars: tuple[str, ...] = ()
    """Environment variables the stack reads that change a graph or its cache key."""
    implied_flags: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Flags the stack adds to XLA_FLAGS / LIBTPU_INIT_ARGS at import, before anything compiles."""
    devices: tuple[str, ...] = ("cpu", "tpu")
    watcher: str | None = None
    """``module:callable`` the guard installs in a serving process; None: the guard logs that it is unwatched."""
    probe: str | None = None
    """``module:callable() -> dict`` ``aotc doctor`` runs: can this stack load its own persistent cache?
    The dict carries at least ``loadable`` (bool) and ``verdict`` (one line)."""
    serve: str | None = None
    """``module:callable(entry: dict, cache_dir) -> (engine_args, env)``: the stock ``vllm serve`` for an
    entry (aotc/server.py turns it into a command line; env values None mean unset)."""
    cache_log: str | None = None
    """``module:callable() -> {"env": {...}, "hit": regex, "miss": regex}``: logging-only settings under which
    the stack logs each persistent-cache lookup (both regexes capture graph name and cache key); the
    canary counts start-up hits with it. None: the cache's files are the only evidence."""
    unserved: Mapping[str, str] = field(default_factory=dict)
    """Request options the stock server of this stack cannot serve -> why (the upstream reference). The
    canary leaves them out of its load and reports each one: a documented limitation, never a silent skip."""
    pins: Mapping[str, str] = field(default_factory=dict)
    """The versions of ``packages`` this aotc supports (its lock file; a test keeps them equal): the
    fingerprint's versions where the runner's interpreter is not installed, e.g. a fetch init container."""
    cache_loads: bool = False
    """The stack reads its persistent cache back: a build may seed it from the store (aotc/reuse.py) and the
    runner's build result lists ``cache_reads`` / ``cache_writes`` (cache file names)."""
    validate: str | None = None
    """``module:callable(entry, hf_config) -> list[str]``: the stack's own rules for an entry, one problem a
    line as ``KEY.PATH: reason`` with the key path relative to the model (``env.X: ...``); [] when valid."""
    kv_size: str | None = None
    """Module run as ``python -m <module>`` with an entry's JSON on stdin that prints ``{"kv_blocks": N}``: the
    KV page count the stack itself sizes for the entry on its device (aotc/kv.py); it names the variables
    that sizing reads besides the fingerprint's in ``SIZING_ENV``. None: the full-length rule (buckets
    ``kv_page_size(entry)``)."""
    twin_modules: tuple[str, ...] = ()
    """Modules of the runner's CPU twin whose code enters the compiled graphs of ``device: cpu`` entries (e.g.
    its stand-in attention): the fingerprint hashes their code, so a changed twin never reuses stale graphs."""

    @property
    def python_env(self) -> str:
        """The variable naming this runner's interpreter when its stack has its own venv."""
        return "AOTC_PYTHON_" + self.name.upper().replace("-", "_")

    def load(self, attribute: str) -> Any:
        """Import one of the spec's ``module`` / ``module:callable`` strings."""
        target = getattr(self, attribute)
        module, _, name = target.partition(":")
        loaded = importlib.import_module(module)
        return getattr(loaded, name) if name else loaded


class UnknownRunner(ValueError):
    pass


@functools.cache
def registered() -> dict[str, RunnerSpec]:
    specs = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        spec = ep.load()
        if not isinstance(spec, RunnerSpec) or spec.name != ep.name:
            raise TypeError(f"entry point {ep.name} = {ep.value} is not a RunnerSpec named {ep.name!r}")
        specs[spec.name] = spec
    return specs


def load_runner(name: str) -> RunnerSpec:
    try:
        return registered()[name]
    except KeyError:
        known = ", ".join(sorted(registered())) or "none installed"
        raise UnknownRunner(f"unknown runner {name!r} (registered: {known})") from None
