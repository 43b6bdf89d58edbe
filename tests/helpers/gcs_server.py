"""Moved to aotc/testing/gcs_server.py (shared with bench/); kept so the tests' imports stay stable."""

from aotc.testing.gcs_server import FakeGcs, free_port  # noqa: F401
