"""The graph plan: every graph an entry needs, as data, before anything compiles.

The runner executes a plan; it does not decide it. The rules themselves are the runner's (each
backend pads differently) and live beside it, imported here without any heavy dependency.
"""

from __future__ import annotations

import importlib
import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from aotc.matrix import Entry

@dataclass(frozen=True)
class GraphSpec:
    family: str
    shape: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, family: str, **shape: Any) -> GraphSpec:
        return cls(family, tuple(shape.items()))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GraphSpec:
        return cls(data["family"], tuple(data["shape"].items()))

    @property
    def shape_dict(self) -> dict[str, Any]:
        return dict(self.shape)

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={json.dumps(v)}" for k, v in self.shape)

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "shape": self.shape_dict}


@dataclass(frozen=True)
class BuildPlan:
    entry: Entry
    graphs: tuple[GraphSpec, ...]
    buckets: dict[str, Any]

    def families(self) -> Counter:
        return Counter(g.family for g in self.graphs)

    def to_dict(self) -> dict[str, Any]:
        return {"entry": self.entry.name, "runner": self.entry.runner, "device": self.entry.device,
                "buckets": self.buckets, "families": dict(self.families()),
                "total": len(self.graphs), "graphs": [g.to_dict() for g in self.graphs]}


# Each runner's padding rules, importable without its stack.
RUNNER_BUCKETS = {"vllm-tpu": "aotc.runners.vllm_tpu.buckets", "tpu-inference": "aotc.runners.tpu_inference.buckets"}


def plan_entry(entry: Entry) -> BuildPlan:
    if entry.runner not in RUNNER_BUCKETS:
        raise ValueError(f"unknown runner {entry.runner!r}")
    buckets = importlib.import_module(RUNNER_BUCKETS[entry.runner])
    hf_config = _hf_config(entry)
    return BuildPlan(entry, tuple(buckets.capture_plan(entry, hf_config)), buckets.bucket_summary(entry))


def plan_entries(entries: list[Entry]) -> list[BuildPlan]:
    return [plan_entry(e) for e in entries]


def _hf_config(entry: Entry) -> dict | None:
    path = entry.model_config_path
    return json.loads(path.read_text()) if path and path.is_file() else None


def render_plans(plans: list[BuildPlan], console) -> None:
    from rich.table import Table

    for plan in plans:
        table = Table(title=f"{plan.entry.name}  ({plan.entry.runner}, {plan.entry.device})",
                      title_justify="left", show_lines=False)
        table.add_column("family")
        table.add_column("graphs", justify="right")
        table.add_column("shapes")
        by_family: dict[str, list[GraphSpec]] = {}
        for g in plan.graphs:
            by_family.setdefault(g.family, []).append(g)
        for family, specs in by_family.items():
            table.add_row(family, str(len(specs)), _shape_summary(specs))
        table.add_section()
        table.add_row("total", str(len(plan.graphs)), _bucket_line(plan.buckets))
        console.print(table)
    if len(plans) > 1:
        console.print(f"{len(plans)} entries, {sum(len(p.graphs) for p in plans)} graphs in all")


def _shape_summary(specs: list[GraphSpec]) -> str:
    """Each shape dimension with the values it takes across the family, e.g. ``num_reqs: 8,16,32``."""
    values: dict[str, list[Any]] = {}
    for spec in specs:
        for key, value in spec.shape:
            if value not in values.setdefault(key, []):
                values[key].append(value)
    return " · ".join(f"{k}: {','.join(json.dumps(v) for v in vs)}" for k, vs in values.items())


def _bucket_line(buckets: dict[str, Any]) -> str:
    return "; ".join(f"{k}={v}" for k, v in buckets.items())
