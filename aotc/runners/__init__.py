"""Runners: each drives one serving stack through a plan in a fresh process (``python -m <runner>``).

Kept import-light: the core imports this package without torch, vLLM or JAX.
"""

# A runner prints one such line (then JSON) to stderr per finished graph family; ``aotc build``
# follows the runner's log and turns them into progress lines.
PROGRESS_MARKER = "aotc-progress"
