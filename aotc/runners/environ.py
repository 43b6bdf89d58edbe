"""The runner process's environment, set before its stack is imported (the stacks read it at import)."""

from __future__ import annotations

import os


def apply_env(env: dict[str, str | None]) -> None:
    """Set each variable; ``None`` unsets it."""
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
