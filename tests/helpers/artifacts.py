"""Moved to aotc/testing/artifacts.py (shared with bench/); kept so the tests' imports stay stable."""

from aotc.testing.artifacts import expected_dest, make_artifact, random_files, tree  # noqa: F401
