"""The graph plan: every graph an entry needs, as data, before anything compiles.

The runner executes a plan; it does not decide it. The rules themselves are the runner's (each
backend pads differently): its ``RunnerSpec.buckets`` module, imported without any heavy dependency.
"""

from __future__ import annotations

import json

from aotc.engine_args import with_hf_overrides
from aotc.graphs import BuildPlan, GraphSpec
from aotc.matrix import Entry

__all__ = ["BuildPlan", "GraphSpec", "plan_entry", "plan_entries"]


def plan_entry(entry: Entry) -> BuildPlan:
    runner = entry.backend
    graphs = tuple(runner.capture_plan(entry, hf_config(entry)))
    return BuildPlan(entry, graphs, runner.bucket_summary(entry))


def plan_entries(entries: list[Entry]) -> list[BuildPlan]:
    return [plan_entry(e) for e in entries]


def hf_config(entry: Entry) -> dict | None:
    """The entry's local config.json as vLLM sees it (with the entry's ``hf_overrides``)."""
    path = entry.model_config_path
    return with_hf_overrides(json.loads(path.read_text()), entry.engine) if path and path.is_file() else None
