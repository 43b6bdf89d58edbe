"""The compiler flags a graph's cache key hashes: XLA_FLAGS and LIBTPU_INIT_ARGS as JAX reads them, with
what the runner's stack prepends at import. Shared by the core's fingerprint and the runners' builds."""

from __future__ import annotations

from aotc.runners.spec import load_runner

FLAG_ENV_VARS = ("XLA_FLAGS", "LIBTPU_INIT_ARGS")


def server_imports(environ: dict[str, str]) -> int:
    """How often a stock ``vllm serve`` imports the runner's stack before its engine compiles: in the API
    server and again in the engine-core process, which inherits the first one's environment (one process
    when multiprocessing is off, as in aotc's own build)."""
    return 1 if environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0" else 2


def xla_flags(environ: dict[str, str], runner: str | None = None, imports: int | None = None,
              entry_flags: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """The words of XLA_FLAGS and LIBTPU_INIT_ARGS as JAX's cache key hashes them (jax/_src/cache_key.py,
    ``_hash_xla_flags``): split on whitespace, sorted, duplicates kept. ``environ`` is the launch
    environment; the flags the runner's stack prepends at import (``RunnerSpec.implied_flags``) are added
    once per import (``imports``, default: a stock server's, ``server_imports``); pass ``imports=0`` for the
    live environment of a process that already imported it. ``entry_flags`` (``RunnerSpec.entry_flags``: the
    twin's virtual device count) are set once in the launch environment, unless it holds them already.
    Stricter than JAX in one way: its dump-only flags count here too."""
    implied = load_runner(runner).implied_flags if runner else {}
    imports = server_imports(environ) if imports is None else imports
    flags: list[str] = []
    for var in FLAG_ENV_VARS:
        launch = environ.get(var, "").split()
        launch += [w for w in (entry_flags or {}).get(var, ()) if w not in launch]
        words = list(implied.get(var, ())) * imports + launch
        flags += [f"{var}:{w}" for w in words]
    return sorted(flags)
