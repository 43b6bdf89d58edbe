"""The graph-plan data types: one graph as data, and every graph an entry needs.

A leaf module (it imports nothing from aotc), so that a runner's plan rules can build ``GraphSpec`` s
without importing the core's planner, and the planner can import the rules without a cycle.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aotc.entry import Entry


def graph_key(family: str, shape: dict[str, Any]) -> str:
    """Identity of a graph independent of the order of its shape's keys (plan, manifest and report agree)."""
    return json.dumps([family, shape], sort_keys=True)


@dataclass(frozen=True)
class GraphSpec:
    family: str
    shape: tuple[tuple[str, Any], ...]
    beyond_warmup: bool = False
    """A graph a stock server reaches that the stack's own warm-up skips: aotc compiles it itself."""

    @classmethod
    def of(cls, family: str, beyond_warmup: bool = False, **shape: Any) -> GraphSpec:
        return cls(family, tuple(shape.items()), beyond_warmup)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GraphSpec:
        return cls(data["family"], tuple(data["shape"].items()), bool(data.get("beyond_warmup", False)))

    @property
    def shape_dict(self) -> dict[str, Any]:
        return dict(self.shape)

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={json.dumps(v)}" for k, v in self.shape)

    @property
    def key(self) -> str:
        return graph_key(self.family, self.shape_dict)

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "shape": self.shape_dict, **({"beyond_warmup": True} if self.beyond_warmup else {})}


@dataclass(frozen=True)
class BuildPlan:
    entry: Entry
    graphs: tuple[GraphSpec, ...]
    buckets: dict[str, Any]
    # where the model's config.json came from (``source``: local, huggingface-cache, unavailable), as
    # plan.model_config_source says; a plan without one follows the matrix alone
    model_config: dict[str, Any] | None = None

    def families(self) -> Counter:
        return Counter(g.family for g in self.graphs)

    def to_dict(self) -> dict[str, Any]:
        return {"entry": self.entry.name, "runner": self.entry.runner, "device": self.entry.device,
                "buckets": self.buckets, "families": dict(self.families()),
                "total": len(self.graphs), "beyond_warmup": sum(g.beyond_warmup for g in self.graphs),
                "graphs": [g.to_dict() for g in self.graphs],
                **({"model_config": self.model_config} if self.model_config else {})}
