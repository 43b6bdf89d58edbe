"""A toy third backend, as a third party would ship one: its own package, registered only through the
``aotc.runners`` entry point (aotc_toy_runner-0.1.0.dist-info/entry_points.txt), no core edit.

It "compiles" a graph by writing one file named after the graph's digest; verify reads them back.
No vLLM, no XLA: it exercises the runner interface and the protocol, not a compiler.
"""

from __future__ import annotations

from dataclasses import dataclass

from aotc.entry import Entry
from aotc.runners.spec import Planner, RunnerSpec


@dataclass(frozen=True)
class ToyRunner(RunnerSpec):
    @property
    def planner(self) -> Planner:
        from aotc_toy_runner.buckets import PLANNER

        return PLANNER

    def validate(self, entry: Entry, hf_config: dict | None) -> list[str]:
        from aotc_toy_runner.buckets import validate

        return validate(entry, hf_config)


SPEC = ToyRunner(
    name="toy",
    module="aotc_toy_runner",
    packages=("pyyaml",),
    env_vars=("AOTC_TOY_SALT",),
    devices=("cpu",),
    loads_models=False,
)
