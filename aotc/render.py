"""Terminal rendering for the CLI (rich): the library returns data, this module draws it.

Owned by the CLI layer; no library module imports rich.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aotc.build import BuildReport, EntryBuild
    from aotc.fingerprint import Fingerprint
    from aotc.graphs import BuildPlan, GraphSpec
    from aotc.verify import VerifyResult


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
        table.add_row("total", str(len(plan.graphs)), "; ".join(f"{k}={v}" for k, v in plan.buckets.items()))
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


def render_fingerprint(name: str, fp: Fingerprint, console) -> None:
    from rich.table import Table

    from aotc.fingerprint import flatten

    console.print(f"[bold]{name}[/bold]  {fp.digest}")
    table = Table(show_header=True, box=None)
    table.add_column("input")
    table.add_column("value")
    for key, value in sorted(flatten(fp.inputs).items()):
        table.add_row(key, json.dumps(value))
    console.print(table)


class BuildProgressLines:
    """``aotc build``'s progress (aotc/build.py: BuildEvents): plain lines on stderr, readable in CI logs too;
    the runner's own log goes to a file."""

    def started(self, name: str, planned: int) -> None:
        print(f"aotc build: {name}: compiling {planned} planned graphs + traffic sweep", file=sys.stderr, flush=True)

    def family(self, name: str, family: str, seconds: float) -> None:
        print(f"aotc build: {name}: {family} compiled in {seconds:.1f}s", file=sys.stderr, flush=True)

    def finished(self, report: EntryBuild) -> None:
        status = "ok" if report.ok else f"FAILED: {report.error}"
        print(f"aotc build: {report.entry}: {status} ({report.wall_seconds:.0f}s, {report.files} files, "
              f"log {report.log})", file=sys.stderr, flush=True)


def render_build(report: BuildReport, console) -> None:
    from rich.table import Table

    table = Table(title="aotc build", title_justify="left")
    for column in ("entry", "status", "planned", "with keys", "runtime", "files", "MB", "wall s", "XLA s"):
        table.add_column(column, justify="left" if column in ("entry", "status") else "right")
    for e in report.entries:
        table.add_row(e.entry, "ok" if e.ok else "[red]FAILED[/red]", str(e.planned), str(e.graphs_with_keys),
                      str(e.runtime_graphs), str(e.files), f"{e.size / 1e6:.1f}", f"{e.wall_seconds:.1f}",
                      f"{e.compile_seconds:.1f}")
    console.print(table)
    for e in report.entries:
        if e.ok:
            console.print(f"{e.entry}: artifact at {e.artifact_dir}")
        else:
            console.print(f"[red]{e.entry}: {e.error}[/red]")
            for problem in e.problems[1:]:
                console.print(f"  {problem}")
            console.print(f"  log: {e.log}")


def render_verify(result: VerifyResult, console) -> None:
    from rich.table import Table

    table = Table(title=f"aotc verify {result.entry}", title_justify="left")
    for column in ("family", "misses", "found in cache", "loaded", "deserialize failures", "XLA compiles"):
        table.add_column(column, justify="left" if column == "family" else "right")
    for name, c in result.families.items():
        table.add_row(name, str(c.misses), str(c.found), str(c.loads), str(c.deserialize_failures), str(c.compiles))
    console.print(table)
    console.print(f"replayed {result.replayed_graphs} graphs and {result.traffic_requests} random requests "
                  f"(seed {result.seed})")
    for miss in result.missed:
        console.print(f"  missed: {miss.get('family')} {miss.get('shape', '')} {miss.get('key', '')}")
    if result.evidence:
        console.print(f"evidence: {result.evidence}")
    style = "red" if not result.ok else ("green" if result.loadable else "yellow")
    console.print(f"[{style}]{result.verdict}[/{style}]")


def render_doctor(report: dict[str, Any], console) -> None:
    console.print(f"aotc {report['aotc_version']} on Python {report['python']} ({report['machine']})")
    for runner, info in report["runners"].items():
        console.print(f"runner {runner} ({info['python']})")
        for name, version in info["versions"].items():
            if name != "error":
                console.print(f"  {name:14} {version or '[dim]not installed[/dim]'}")
        console.print(f"  runner env: {info['env'] or '{}'}")
        console.print(f"  xla flags:  {info['xla_flags'] or '[]'}")
    for problem in report.get("problems", []):
        console.print(f"[red]{problem}[/red]")
    probe = report.get("loadability")
    if probe:
        console.print(f"loadability probe ({report['default_runner']}): {probe['verdict']}")
        for name in ("first_process", "second_process"):
            if name in probe:
                console.print(f"  {name.replace('_', ' ') + ':':16} {probe[name]}")
