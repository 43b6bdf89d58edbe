"""The compiler flags a graph's cache key hashes: XLA_FLAGS and LIBTPU_INIT_ARGS as JAX reads them.

A stack may prepend its own words to these variables when it is imported (tpu-inference's env_override.py).
Each process that imports it adds one more copy on top of what it inherited: a stock ``vllm serve`` engine
core sees them twice (API server, then its own import), an in-process ``LLM(...)`` once. JAX hashes every
word into each persistent-cache key, so the layouts would compute different keys for the same graph.
Collapsing the stack's words to one copy each (aotc's vLLM plugin does, in every process) makes every layout
hash the same words, and ``xla_flags`` predicts them for the fingerprint and the runners' builds.

Standard library only, besides the runner spec: vLLM loads the plugin that applies it in every process.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from aotc.runners.spec import load_runner

FLAG_ENV_VARS = ("XLA_FLAGS", "LIBTPU_INIT_ARGS")


def xla_flags(environ: Mapping[str, str], runner: str | None = None,
              entry_flags: Mapping[str, tuple[str, ...]] | None = None) -> list[str]:
    """The words of XLA_FLAGS and LIBTPU_INIT_ARGS as JAX's cache key hashes them (jax/_src/cache_key.py,
    ``_hash_xla_flags``): split on whitespace, sorted, duplicates kept.

    With ``runner``, ``environ`` is a launch environment and the result what any process of a server or an
    in-process engine hashes: the flags the runner's stack prepends at import (``RunnerSpec.stack_flags``)
    once each, however many of its processes imported it, because aotc's vLLM plugin collapses them;
    ``entry_flags`` (``Planner.implied_flags``: the twin's virtual device count) are set once in the launch
    environment, unless it holds them already. Without ``runner``: the words of ``environ`` as they are (a
    live process's). Stricter than JAX in one way: its dump-only flags count here too."""
    implied = load_runner(runner).stack_flags if runner else {}
    flags: list[str] = []
    for var in FLAG_ENV_VARS:
        launch = environ.get(var, "").split()
        launch += [w for w in (entry_flags or {}).get(var, ()) if w not in launch]
        own = implied.get(var, ())
        flags += [f"{var}:{w}" for w in collapse_words([*own, *launch], own)]
    return sorted(flags)


def collapse_words(words: Iterable[str], implied: Iterable[str]) -> list[str]:
    """``words`` with each ``implied`` word kept once, at its last place; every other word stays, in its
    order, repeats included (a launch's own flags are the pod's business). Dropping only earlier copies of
    a word keeps every flag's value: XLA takes a flag's last one."""
    implied = set(implied)
    seen: set[str] = set()
    kept = []
    for word in reversed(list(words)):
        if word in implied:
            if word in seen:
                continue
            seen.add(word)
        kept.append(word)
    return kept[::-1]


def collapse_flag_env(environ: Mapping[str, str], implied: Mapping[str, Iterable[str]]) -> dict[str, str]:
    """The flag variables of ``environ`` whose words change when ``implied`` (variable -> the stack's own
    words) is collapsed, with their new values; {} when each implied word occurs at most once already."""
    changed = {}
    for var, words in implied.items():
        current = environ.get(var, "").split()
        collapsed = collapse_words(current, words)
        if collapsed != current:
            changed[var] = " ".join(collapsed)
    return changed
