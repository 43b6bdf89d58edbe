"""The graph plan: every graph an entry needs, as data, before anything compiles.

The runner executes a plan; it does not decide it. The rules themselves are the runner's (each
backend pads differently): its ``RunnerSpec.planner``, which imports no heavy dependency.
"""

from __future__ import annotations

from typing import Any

from aotc.entry import Entry, hf_config
from aotc.errors import BadInput
from aotc.graphs import BuildPlan, GraphSpec
from aotc.hf_cache import download_hint, hub_cache_dir
from aotc.matrix import entry_problems

__all__ = ["BuildPlan", "GraphSpec", "hf_config", "model_config_source", "plan_entry", "plan_entries"]


def plan_entry(entry: Entry) -> BuildPlan:
    """The entry's graphs. Its refusals first (``entry_problems``), with the config.json this machine reads now:
    a build fetches a hub model's after the matrix was read without it."""
    planner, config = entry.backend.planner, hf_config(entry)
    if problems := entry_problems(entry, config):
        raise BadInput(f"{entry.name}: {problems[0]}")
    graphs = tuple(planner.capture_plan(entry, config))
    return BuildPlan(entry, graphs, planner.bucket_summary(entry, config), model_config_source(entry))


def model_config_source(entry: Entry) -> dict[str, Any]:
    """Where the plan read the model's config.json. Without one, a plan is only as right as for a dense text
    model: a MoE, vision or drafting model's own graphs and the stack's refusals need its config."""
    if entry.model_path:
        return {"source": "local", "path": str(entry.model_config_path)}
    if path := entry.readable_config_path:
        return {"source": "huggingface-cache", "path": str(path)}
    return {"source": "unavailable",
            "reason": f"{entry.model}@{entry.revision}: config.json is not in the Hugging Face cache "
                      f"({hub_cache_dir()}); planned from the matrix alone",
            "hint": download_hint(entry.model, entry.revision)}


def plan_entries(entries: list[Entry]) -> list[BuildPlan]:
    return [plan_entry(e) for e in entries]
