"""Terminal rendering for the CLI (rich, tqdm): the library returns data (frozen records), this module draws
it — plan, build progress and results, verify, canary, doctor, and the store commands (publish, fetch, ls,
gc, completeness, break-lease). No library module imports rich; HTML is aotc/report.py's.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from aotc.files import human_size

if TYPE_CHECKING:
    from aotc.build import BuildReport, EntryBuild
    from aotc.canary_verdict import CanaryResult
    from aotc.fingerprint import Fingerprint
    from aotc.graphs import BuildPlan, GraphSpec
    from aotc.verify import VerifyReport


def render_plans(plans: list[BuildPlan], console) -> None:
    from rich.table import Table
    from rich.text import Text

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
            if beyond := [g for g in specs if g.beyond_warmup]:
                # the stack's own warm-up skips these; a server reaches them: aotc compiles them itself
                table.add_row("", f"({len(beyond)})", f"beyond the stack's warm-up: {_shape_summary(beyond)}")
        table.add_section()
        table.add_row("total", str(len(plan.graphs)), "; ".join(f"{k}={v}" for k, v in plan.buckets.items()))
        console.print(table)
    for reason, hint in dict.fromkeys(_unavailable_configs(plans)):
        console.print(Text(f"{reason}: a MoE, vision or drafting model plans more graphs; `{hint}` makes its "
                           "config available offline", style="yellow"), soft_wrap=True)  # one line to grep
    if len(plans) > 1:
        console.print(f"{len(plans)} entries, {sum(len(p.graphs) for p in plans)} graphs in all")


def _unavailable_configs(plans: list[BuildPlan]) -> list[tuple[str, str]]:
    """One warning per model and revision whose config.json this machine lacks."""
    return [(p.model_config["reason"], p.model_config["hint"]) for p in plans
            if p.model_config and p.model_config["source"] == "unavailable"]


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

    def started(self, name: str, planned: int, sweep: bool = True) -> None:
        then = ("+ traffic sweep" if sweep
                else "for its TPU, compile-only (no traffic sweep: this host has no TPU to run it)")
        print(f"aotc build: {name}: compiling {planned} planned graphs {then}", file=sys.stderr, flush=True)

    def family(self, name: str, family: str, seconds: float) -> None:
        print(f"aotc build: {name}: {family} compiled in {seconds:.1f}s", file=sys.stderr, flush=True)

    def finished(self, report: EntryBuild) -> None:
        if report.source == "store":
            print(f"aotc build: {report.entry}: up to date, taken as published from the store ({report.files} files, "
                  f"{report.wall_seconds:.1f}s; --no-reuse builds it again)", file=sys.stderr, flush=True)
            return
        status = "ok" if report.ok else f"FAILED: {report.error}"
        if report.ok and report.compiled is not None:
            status += f", {report.compiled} compiled, {report.reused} reused from the store"
        print(f"aotc build: {report.entry}: {status} ({report.wall_seconds:.0f}s, {report.files} files, "
              f"log {report.log})", file=sys.stderr, flush=True)


def render_build(report: BuildReport, console) -> None:
    from rich.table import Table

    table = Table(title="aotc build", title_justify="left")
    for column in ("entry", "status", "planned", "with keys", "runtime", "files", "compiled", "reused", "MB",
                   "wall s", "XLA s"):
        table.add_column(column, justify="left" if column in ("entry", "status") else "right")
    for e in report.entries:
        status = ("ok" if e.source == "built" else "from store") if e.ok else "[red]FAILED[/red]"
        table.add_row(e.entry, status, str(e.planned), str(e.graphs_with_keys),
                      str(e.runtime_graphs), str(e.files), _count(e.compiled), _count(e.reused),
                      f"{e.size / 1e6:.1f}", f"{e.wall_seconds:.1f}", f"{e.compile_seconds:.1f}")
    console.print(table)
    for e in report.entries:
        if e.ok:
            console.print(f"{e.entry}: artifact at {e.artifact_dir}")
        else:
            console.print(f"[red]{e.entry}: {e.error}[/red]")
            for problem in e.problems[1:]:
                console.print(f"  {problem}")
            console.print(f"  log: {e.log}")


def _count(n: int | None) -> str:
    return "-" if n is None else str(n)


def render_verify(result: VerifyReport, console) -> None:
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
    for runner, targets in report.get("tpu_targets", {}).items():
        console.print(f"TPU targets {runner} compiles for on this host (no TPU needed):")
        for target in targets:
            said = target.get("error") or (f"{target['topology']}, {target['devices']} x {target['device_kind']}, "
                                           f"{target['platform_version'].splitlines()[-1]}")
            console.print(f"  {target['accelerator']:8} {said}")
    for problem in report.get("problems", []):
        console.print(f"[red]{problem}[/red]")
    probe = report.get("loadability")
    if probe:
        console.print(f"loadability probe ({report['default_runner']}): {probe['verdict']}")
        for name in ("first_process", "second_process"):
            if name in probe:
                console.print(f"  {name.replace('_', ' ') + ':':16} {probe[name]}")


def progress_bar(enabled: bool, description: str) -> Any:
    """A tqdm bar on stderr, or None; the library only ever talks to the Callback."""
    if not enabled:
        return None
    from fsspec.callbacks import TqdmCallback

    return TqdmCallback(tqdm_kwargs={"desc": description, "unit": "B", "unit_scale": True,
                                     "unit_divisor": 1024, "file": sys.stderr, "leave": False})


def warn(message: Any) -> None:
    print(f"aotc: warning: {one_line(message)}", file=sys.stderr)


def one_line(message: Any) -> str:
    """Text from a store (names, reasons) as one printable line: a newline, control character or lone
    surrogate is shown as its escape, so a warning or an error stays one line however odd the data."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(message))


def print_warnings(warnings: Iterable[Any]) -> None:
    for warning in warnings:
        warn(warning)


def render_ls(info: Any, console: Any) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"aotc store {info.url}", title_justify="left")
    for column in ("entry", "fingerprint", "created", "files", "size", ""):
        table.add_column(column, justify="right" if column in ("files", "size") else "left")
    for entry in info.entries:
        for m in entry.manifests:
            marks = ["ref" if m.fingerprint == entry.ref else ""]
            if m.missing_objects:
                marks.append(f"[red]{m.missing_objects} missing[/red]")
            table.add_row(entry.name, m.fingerprint[:16], escape(m.created), str(m.file_count), m.size_str,
                          " ".join(x for x in marks if x))
    console.print(table)
    console.print(f"{len(info.objects)} objects, {info.size_on_store_str} on store")


def render_gc(strategy: Any, dry_run: bool, console: Any, report: Any = None) -> None:
    verb = "would delete" if dry_run else "deleted"
    console.print(f"gc keep={strategy.keep}: {verb} {len(strategy.manifests_to_delete)} manifest(s), "
                  f"{len(strategy.objects_to_delete)} object(s) ({strategy.expected_freed_size_str})")
    for m in strategy.manifests_to_delete:
        console.print(f"  {m.entry} {m.fingerprint[:16]} {m.created}", markup=False)
    if strategy.objects_too_new:
        console.print(f"  kept {len(strategy.objects_too_new)} unreferenced object(s) younger than "
                      f"{strategy.min_age:.0f}s (a publish may be about to reference them)")
    if report and report.deferred_by:
        console.print(f"  deferred {report.deferred_objects} object(s): "
                      f"{len(report.deferred_by)} publish(es) in progress or manifest(s) unreadable")
    if report and report.spared_referenced:
        console.print(f"  spared {report.spared_referenced} object(s) referenced by a new manifest")


def render_publish(results: list[Any], url: str, console: Any) -> None:
    from rich.table import Table

    from aotc.publish import ALREADY, OTHER_WON, PUBLISHED

    table = Table(title=f"published to {url}", title_justify="left")
    for column in ("entry", "fingerprint", "status", "uploaded", "repaired", "retried", "reused", "size", "seconds"):
        table.add_column(column)
    labels = {PUBLISHED: "[green]published[/green]", ALREADY: "already there",
              OTHER_WON: "[yellow]another publish won[/yellow]"}
    for r in results:
        table.add_row(r.entry, r.fingerprint[:16], labels.get(r.status, r.status),
                      f"{r.uploaded_objects} ({human_size(r.uploaded_size)})", str(r.repaired_objects),
                      str(r.retried_uploads), str(r.reused_objects), human_size(r.size), f"{r.seconds:.1f}")
    console.print(table)


def render_fetch(result: Any, console: Any) -> None:
    rate = result.size / result.seconds if result.seconds > 0 else 0.0
    retried = f", {result.retried_objects} object(s) re-downloaded" if result.retried_objects else ""
    cached = (f", {result.cached_objects} of {result.objects} object(s) from the node cache"
              if result.cache_dir else "")
    console.print(f"fetched {result.entry} {result.fingerprint[:16]} → {result.dest}: {result.files} files, "
                  f"{human_size(result.size)} in {result.seconds:.1f}s ({human_size(int(rate))}/s){retried}"
                  f"{cached}")


def completeness_lines(report: Any) -> list[str]:
    return [f"not published: {row.entry} {row.fingerprint[:16]} in {report.store}" for row in report.missing] + [
        f"{len(report.entries) - len(report.missing)}/{len(report.entries)} entries of {report.config} "
        f"published in {report.store}"]


def lease_lines(decisions: list[Any]) -> list[str]:
    lines = []
    for d in decisions:
        age = "unknown age" if d.lease.age is None else f"age {d.lease.age:.0f}s"
        verb = "removed" if d.removed else "refused to remove"
        hint = "" if d.removed else "; --force removes it anyway"
        lines.append(f"{verb} {d.lease.kind} lease {one_line(d.lease.url)} ({age}): {one_line(d.checked)}{hint}")
    return lines or ["no matching lease"]


def render_canary(result: CanaryResult, console) -> None:
    s, r = result.startup, result.serving
    console.print(f"[bold]{result.entry}[/bold]  {result.fingerprint[:12]}  ready {result.ready_seconds} s, "
                  f"{result.requests} requests ({result.failed_requests} failed)")
    lookups = f", {s.hits}/{s.lookups} lookups hit" if s.lookups is not None else ""
    console.print(f"  start-up: {len(s.missing)} graphs the cache lacks, {len(s.rewritten_files)} cached graphs "
                  f"recompiled{lookups}")
    console.print(f"  after ready: {len(r.missing)} graphs the cache lacks, {len(r.rewritten_files)} cached graphs "
                  f"recompiled" + (f", {r.hits}/{r.lookups} lookups hit" if r.lookups is not None else ""))
    for name in result.graphs_missing:
        console.print(f"  [red]compiled, not in the cache:[/red] {name}")
    for problem in result.problems:
        console.print(f"  [red]problem:[/red] {problem}")
    style = "red" if result.unexplained_failures else "yellow"  # yellow: strict on a recompiled cached graph
    for failure in result.failures:
        console.print(f"  [{style}]failed request:[/{style}] {failure}")
    for name, kind in result.kinds.items():
        console.print(f"  {name}: " + (f"not sent ({kind.not_sent})" if kind.not_sent else
                                       f"{kind.ok}/{kind.sent} served" + (f", {kind.rejected} refused by the stack"
                                                                         if kind.rejected else "")
                                       + (f", {kind.failed} failed" if kind.failed else "")))
    for limitation in result.limitations:
        console.print(f"  [yellow]limitation:[/yellow] {limitation}")
    if result.guard:
        console.print("  guard: " + ", ".join(f"{k} {v:g}" for k, v in sorted(result.guard.items())))
    console.print(result.verdict)
