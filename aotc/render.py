"""Terminal rendering for the store commands (publish, fetch, ls, gc, completeness): part of the CLI layer.

The library returns frozen records; this module turns them into rich tables, one-line summaries, warning
lines on stderr and a progress bar (an fsspec ``Callback`` the library feeds).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from aotc.files import human_size


def progress_bar(enabled: bool, description: str) -> Any:
    """A tqdm bar on stderr, or None; the library only ever talks to the Callback."""
    if not enabled:
        return None
    from fsspec.callbacks import TqdmCallback

    return TqdmCallback(tqdm_kwargs={"desc": description, "unit": "B", "unit_scale": True,
                                     "unit_divisor": 1024, "file": sys.stderr, "leave": False})


def warn(message: Any) -> None:
    print(f"aotc: warning: {message}", file=sys.stderr)


def print_warnings(warnings: Iterable[Any]) -> None:
    for warning in warnings:
        warn(warning)


def render_ls(info: Any, console: Any) -> None:
    from rich.table import Table

    table = Table(title=f"aotc store {info.url}", title_justify="left")
    for column in ("entry", "fingerprint", "created", "files", "size", ""):
        table.add_column(column, justify="right" if column in ("files", "size") else "left")
    for entry in info.entries:
        for m in entry.manifests:
            marks = ["ref" if m.fingerprint == entry.ref else ""]
            if m.missing_objects:
                marks.append(f"[red]{m.missing_objects} missing[/red]")
            table.add_row(entry.name, m.fingerprint[:16], m.created, str(m.file_count), m.size_str,
                          " ".join(x for x in marks if x))
    console.print(table)
    console.print(f"{len(info.objects)} objects, {info.size_on_store_str} on store")


def render_gc(strategy: Any, dry_run: bool, console: Any, report: Any = None) -> None:
    verb = "would delete" if dry_run else "deleted"
    console.print(f"gc keep={strategy.keep}: {verb} {len(strategy.manifests_to_delete)} manifest(s), "
                  f"{len(strategy.objects_to_delete)} object(s) ({strategy.expected_freed_size_str})")
    for m in strategy.manifests_to_delete:
        console.print(f"  {m.entry} {m.fingerprint[:16]} {m.created}")
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
    for column in ("entry", "fingerprint", "status", "uploaded", "repaired", "reused", "size", "seconds"):
        table.add_column(column)
    labels = {PUBLISHED: "[green]published[/green]", ALREADY: "already there",
              OTHER_WON: "[yellow]another publish won[/yellow]"}
    for r in results:
        table.add_row(r.entry, r.fingerprint[:16], labels.get(r.status, r.status),
                      f"{r.uploaded_objects} ({human_size(r.uploaded_size)})", str(r.repaired_objects),
                      str(r.reused_objects), human_size(r.size), f"{r.seconds:.1f}")
    console.print(table)


def render_fetch(result: Any, console: Any) -> None:
    rate = result.size / result.seconds if result.seconds > 0 else 0.0
    retried = f", {result.retried_objects} object(s) re-downloaded" if result.retried_objects else ""
    cached = (f", {result.cached_objects} of {result.objects} object(s) from the node cache"
              if result.cache_dir else "")
    console.print(f"fetched {result.entry} {result.fingerprint[:16]} → {result.dest}: {result.files} files, "
                  f"{human_size(result.size)} in {result.seconds:.1f}s ({human_size(int(rate))}/s){retried}"
                  f"{cached}")


def render_completeness(report: Any) -> None:
    for row in report.missing:
        print(f"aotc: not published: {row.entry} {row.fingerprint[:16]} in {report.store}", file=sys.stderr)
    print(f"aotc: {len(report.entries) - len(report.missing)}/{len(report.entries)} entries of {report.config} "
          f"published in {report.store}", file=sys.stderr)


def render_leases(leases: list[Any], verb: str) -> None:
    for lease in leases:
        age = "unknown age" if lease.age is None else f"age {lease.age:.0f}s"
        print(f"aotc: {verb} {lease.kind} lease {lease.url} ({age})", file=sys.stderr)
    if not leases:
        print("aotc: no matching lease", file=sys.stderr)
