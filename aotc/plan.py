"""The graph plan: every graph an entry needs, as data, before anything compiles.

The runner executes a plan; it does not decide it. The rules themselves are the runner's (each
backend pads differently): its ``RunnerSpec.buckets`` module, imported without any heavy dependency.
"""

from __future__ import annotations

from aotc.graphs import BuildPlan, GraphSpec
from aotc.matrix import Entry, hf_config

__all__ = ["BuildPlan", "GraphSpec", "hf_config", "plan_entry", "plan_entries"]


def plan_entry(entry: Entry) -> BuildPlan:
    runner = entry.backend
    graphs = tuple(runner.capture_plan(entry, hf_config(entry)))
    return BuildPlan(entry, graphs, runner.bucket_summary(entry))


def plan_entries(entries: list[Entry]) -> list[BuildPlan]:
    return [plan_entry(e) for e in entries]
