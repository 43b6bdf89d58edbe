"""Runners: each drives one serving stack through a plan in a fresh process (``python -m <runner>``).

The interface is aotc/runners/spec.py (what the core knows of a backend) and aotc/runners/protocol.py
(what crosses the process boundary). Kept import-light: the core imports this package without torch,
vLLM or JAX.
"""
