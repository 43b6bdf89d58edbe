"""Moved to aotc/testing/faultproxy.py (shared with bench/); kept so the tests' imports stay stable."""

from aotc.testing.faultproxy import FaultProxy, Rule  # noqa: F401
