"""One form of XLA_FLAGS / LIBTPU_INIT_ARGS for every process layout of a stack that prepends flags at import.

A stack may prepend its own words to these variables when it is imported (tpu-inference's env_override.py).
Each process that imports it adds one more copy on top of what it inherited: a stock ``vllm serve`` engine
core sees them twice (API server, then its own import), an in-process ``LLM(...)`` once. JAX hashes every
word into each persistent-cache key, so the layouts would compute different keys for the same graph.
Collapsing the stack's words to one copy each makes every layout hash the same words.

Pure and standard library only: vLLM loads the plugin that applies it in every process it starts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


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
