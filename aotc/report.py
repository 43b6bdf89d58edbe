"""``aotc report``: one self-contained HTML page showing what a build or a store holds.

Two halves: ``build_report`` / ``store_report`` gather data (frozen records, no HTML), and
``html_build`` / ``html_store`` turn it into a page with inline CSS and SVG and no script, so it
reads offline as a CI artifact or from a bucket. Entry names, fingerprint inputs and store paths are
user data: every text goes through ``el``/``esc``, which escape anything not already built by them.
"""

from __future__ import annotations

import html
import json
from collections import Counter
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from aotc import __version__
from aotc.errors import BadInput
from aotc.files import replace_file
from aotc.fingerprint import diff_inputs, flatten
from aotc.manifest import RUNTIME, STARTUP, GraphRecord, Manifest, VerifySummary
from aotc.graphs import graph_key
from aotc.plan import BuildPlan, plan_entry
from aotc.store import GcStrategy, Store, StoreInfo, human_size, scan_store

CANARY_FIGURES = ("requests", "compiles_at_startup", "compiles_after_ready", "ready_seconds")
CANARY_SUFFIX = ".canary.json"  # beside an artifact dir: `aotc canary --json` saved by make build-cache
TOP_GRAPHS = 60  # compile-seconds bars drawn; the rest are summed in one line
MAX_GC_ROWS = 500


# --- build data ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """One (entry, family) square of the matrix. ``planned`` is None when the plan is unknown."""

    planned: int | None = 0
    compiled: int = 0  # recorded graphs of this family that have a cache key
    runtime: int = 0  # graphs only the traffic sweep found, attributed to this family
    missing: int = 0  # planned graphs without a cache key

    @property
    def state(self) -> str:
        if self.missing:
            return "missing"
        if self.planned:
            return "compiled"
        if self.compiled:
            return "extra" if self.planned is not None else "compiled"
        return "runtime" if self.runtime else "none"


@dataclass(frozen=True)
class EntryView:
    artifact_dir: str
    manifest: Manifest
    cells: dict[str, Cell]
    plan_note: str | None = None  # why the plan could not be recomputed
    canary: dict[str, Any] | None = None  # see ``canary_of``

    @property
    def name(self) -> str:
        return self.manifest.entry


@dataclass(frozen=True)
class BuildData:
    entries: tuple[EntryView, ...]
    families: tuple[str, ...]
    differing_inputs: tuple[str, ...]  # dotted input keys whose values differ between entries
    generated: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))


def build_report(artifact_dirs: list[str | Path]) -> BuildData:
    if not artifact_dirs:
        raise BadInput("report needs at least one artifact directory")
    entries = tuple(_entry_view(Path(d)) for d in artifact_dirs)
    names = Counter(e.name for e in entries)
    if dupes := sorted(n for n, c in names.items() if c > 1):
        raise BadInput(f"report: entry {dupes[0]!r} is in more than one artifact directory")
    inputs = [e.manifest.inputs for e in entries]
    differing = sorted({k for other in inputs[1:] for k in diff_inputs(inputs[0], other)})
    return BuildData(entries, _family_order(entries), tuple(differing))


def _entry_view(artifact_dir: Path) -> EntryView:
    from aotc.verify import entry_from_manifest  # the manifest's recorded entry config → Entry

    manifest = Manifest.load(artifact_dir)
    try:
        plan: BuildPlan | None = plan_entry(entry_from_manifest(manifest))
        note = None
    except (BadInput, TypeError, ValueError) as exc:  # an old manifest, or a runner this aotc lacks
        plan, note = None, f"plan unavailable: {exc}"
    return EntryView(str(artifact_dir), manifest, entry_cells(manifest.graphs, plan), note,
                     canary_of(artifact_dir, manifest))


def canary_of(artifact_dir: Path, manifest: Manifest) -> dict[str, Any] | None:
    """The canary's figures for this artifact: ``<artifact dir>.canary.json`` beside it (what
    ``aotc canary --json`` printed, as `make build-cache` saves it) when it names the same entry and
    fingerprint, else the manifest's own optional ``canary`` object."""
    beside = artifact_dir.parent / f"{artifact_dir.name}{CANARY_SUFFIX}"
    try:
        result = json.loads(beside.read_text())
    except (OSError, ValueError):
        result = None
    if isinstance(result, dict) and (result.get("entry"), result.get("fingerprint")) == \
            (manifest.entry, manifest.fingerprint):
        return {k: result[k] for k in (*CANARY_FIGURES, "verdict") if k in result}
    canary = manifest.extra.get("canary")
    return canary if isinstance(canary, dict) else None


def entry_cells(graphs: tuple[GraphRecord, ...], plan: BuildPlan | None) -> dict[str, Cell]:
    """Planned vs recorded, per family; a planned graph counts as missing when no record has a key."""
    with_keys = {graph_key(g.family, g.shape) for g in graphs if g.keys}
    planned = Counter(g.family for g in plan.graphs) if plan else Counter()
    missing = Counter(g.family for g in plan.graphs if graph_key(g.family, g.shape_dict) not in with_keys) \
        if plan else Counter()
    compiled = Counter(g.family for g in graphs if g.keys and g.family != RUNTIME)
    runtime = Counter(_runtime_family(g, planned) for g in graphs if g.family == RUNTIME and g.keys)
    families = [*planned, *(f for f in (*compiled, *runtime) if f not in planned)]
    return {f: Cell(planned=planned[f] if plan else None, compiled=compiled[f], runtime=runtime[f],
                    missing=missing[f]) for f in families}


def _runtime_family(graph: GraphRecord, planned: Counter) -> str:
    """A runtime graph's shape says which call found it (``what: "<step>/<family>"``, vllm-tpu runner)."""
    family = str(graph.shape.get("what", "")).rpartition("/")[2]
    return family if family in planned else RUNTIME


def _family_order(entries: tuple[EntryView, ...]) -> tuple[str, ...]:
    order: list[str] = []
    for entry in entries:
        order += [f for f in entry.cells if f not in order and f not in (STARTUP, RUNTIME)]
    return (*order, *(f for f in (STARTUP, RUNTIME) if any(f in e.cells for e in entries)))


def verdict(summary: VerifySummary | None, unproven: str | None = None) -> tuple[str, str]:
    """(css state, words) for one recorded verify summary, in verify's own terms."""
    if summary is None:
        return "none", "not verified"
    if summary.misses:
        return "missing", f"NOT COVERED: {summary.misses} miss(es)"
    if summary.loadable:
        return "compiled", "covered and loadable"
    if unproven:
        return "extra", f"covered, loadability unproven ({unproven})"
    return "extra", "covered, not loadable (a server still compiles)"


def backend_verdicts(entries: tuple[EntryView, ...]) -> list[tuple[str, int, str, str]]:
    """(backend, entries, css state, verdict) per runner and device: the worst entry speaks for it."""
    rank = {"missing": 0, "none": 1, "extra": 2, "compiled": 3}
    backends: dict[str, list[tuple[str, str]]] = {}
    for e in entries:
        backends.setdefault(f"{e.manifest.runner} on {e.manifest.device}", []).append(
            verdict(e.manifest.verify, e.manifest.verify_unproven))
    return [(name, len(v), *min(v, key=lambda sv: rank[sv[0]])) for name, v in sorted(backends.items())]


# --- store data ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoreData:
    info: StoreInfo
    gc: GcStrategy
    generated: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    @property
    def manifests(self) -> int:
        return sum(len(e.manifests) for e in self.info.entries)

    @property
    def logical_size(self) -> int:
        """What the manifests add up to if every entry had its own copy of its files."""
        return sum(m.size for e in self.info.entries for m in e.manifests)

    @property
    def referenced_size(self) -> int:
        referenced = self.info.referenced
        return sum(o.size for o in self.info.objects if o.sha256 in referenced)

    @property
    def dedup_ratio(self) -> float | None:
        return self.logical_size / self.referenced_size if self.referenced_size else None


def store_report(url: str, keep: int = 2, min_age: float | None = None) -> StoreData:
    """Scan the store and plan (never run) the gc that ``aotc gc --keep N --dry-run`` would show."""
    from aotc.store import DEFAULT_MIN_AGE

    info = scan_store(Store.from_url(url))
    return StoreData(info, info.gc(keep=keep, min_age=DEFAULT_MIN_AGE if min_age is None else min_age))


# --- HTML building blocks --------------------------------------------------------------------------


class Safe(str):
    """Markup built here; everything else is text and gets escaped."""


def esc(value: Any) -> Safe:
    return value if isinstance(value, Safe) else Safe(html.escape(str(value), quote=True))


def el(tag: str, *children: Any, **attrs: Any) -> Safe:
    """``<tag attrs>children</tag>``; ``class_`` → class, ``data_x`` → data-x, None/False left out."""
    parts = [tag]
    for key, value in attrs.items():
        if value is None or value is False:
            continue
        name = key.rstrip("_").replace("_", "-")
        parts.append(name if value is True else f'{name}="{esc(value)}"')
    return Safe(f"<{' '.join(parts)}>{''.join(esc(c) for c in children)}</{tag}>")


def join(items: Any) -> Safe:
    return Safe("".join(esc(i) for i in items))


def table(header: list[Any] | None, rows: list[list[Any]], **attrs: Any) -> Safe:
    """A table of cells; ``header=None`` for key/value tables (the first column becomes a header cell)."""
    if header is None:
        body = join(el("tr", el("th", row[0]), join(el("td", c) for c in row[1:])) for row in rows)
        return el("table", el("tbody", body), **attrs)
    head = el("thead", el("tr", join(el("th", h) for h in header)))
    return el("table", head, el("tbody", join(el("tr", join(el("td", c) for c in row)) for row in rows)), **attrs)


def bar(fraction: float, state: str = "") -> Safe:
    width = f"{max(0.0, min(1.0, fraction)) * 100:.1f}%"
    return el("div", el("div", class_=f"fill {state}".strip(), style=f"width:{width}"), class_="bar")


def page(title: str, subtitle: str, sections: list[tuple[str, str, Safe]]) -> str:
    nav = el("nav", join(el("a", name, href=f"#{anchor}") for anchor, name, _ in sections))
    body = join(el("section", el("h2", name), content, id=anchor) for anchor, name, content in sections)
    doc = el("html", el("head", Safe('<meta charset="utf-8">'), el("title", title), el("style", Safe(CSS))),
             el("body", el("header", el("h1", title), el("p", subtitle, class_="sub"), nav), el("main", body)),
             lang="en")
    return "<!DOCTYPE html>\n" + doc + "\n"


CSS = """
:root{--ok:#1a7f37;--okbg:#dafbe1;--bad:#cf222e;--badbg:#ffebe9;--warn:#9a6700;--warnbg:#fff8c5;
--rt:#0969da;--rtbg:#ddf4ff;--muted:#57606a;--line:#d0d7de}
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1f2328}
header{padding:12px 24px;border-bottom:1px solid var(--line);background:#f6f8fa}
h1{margin:0;font-size:20px} h2{font-size:16px;margin:24px 0 8px} .sub{margin:4px 0;color:var(--muted)}
nav a{margin-right:14px} main{padding:0 24px 40px}
table{border-collapse:collapse;margin:4px 0 8px} th,td{border:1px solid var(--line);padding:3px 8px;
text-align:left;vertical-align:top} th{background:#f6f8fa} td.num{text-align:right}
.cell{min-width:92px;font-size:12px} .cell b{font-size:14px}
.compiled{background:var(--okbg)} .missing{background:var(--badbg);color:var(--bad);font-weight:600}
.runtime{background:var(--rtbg)} .extra{background:var(--warnbg)} .none{color:var(--muted)}
.legend span{display:inline-block;padding:2px 8px;margin-right:6px;border:1px solid var(--line)}
.bar{background:#eaeef2;width:320px;height:12px} .fill{height:12px;background:var(--rt)}
.fill.missing{background:var(--bad)} .diff{background:var(--warnbg)} code{font-size:12px}
.scroll{overflow-x:auto;max-width:100%} .note{color:var(--muted)} tbody td:first-child{white-space:nowrap} .warn{color:var(--bad)} svg{display:block}
"""


def _fmt_time(text: str) -> str:
    return text.replace("T", " ")[:19] if text else "?"


# --- build page ------------------------------------------------------------------------------------


def html_build(data: BuildData) -> str:
    title = "aotc build report"
    subtitle = (f"{len(data.entries)} entries · {len(data.families)} graph families · generated "
                f"{_fmt_time(data.generated)} UTC by aotc {__version__}")
    return page(title, subtitle, [
        ("matrix", "Matrix: entries × graph families, per runner", _matrix(data)),
        ("compile-seconds", "Compile seconds per graph", _compile_bars(data)),
        ("cache-size", "Cache size per entry", _size_bars(data)),
        ("verify", "Verify evidence", _verify(data)),
        ("canary", "Canary", _canary(data)),
        ("inputs", "Fingerprint inputs", _inputs(data)),
    ])


def _matrix(data: BuildData) -> Safe:
    """One grid per runner: each runner plans its own graph families, so a grid across runners would be
    mostly empty columns, wider than the page with two backends and a model zoo."""
    legend = el("p", el("span", "compiled: planned graphs all have a cache key", class_="compiled"),
                el("span", "missing: planned without a cache key", class_="missing"),
                el("span", "found at runtime (traffic sweep)", class_="runtime"),
                el("span", "outside the plan (start-up)", class_="extra"), class_="legend")
    return join([legend, *(_grid(runner, entries) for runner, entries in _by_runner(data.entries).items())])


def _by_runner(entries: tuple[EntryView, ...]) -> dict[str, tuple[EntryView, ...]]:
    runners: dict[str, list[EntryView]] = {}
    for e in entries:
        runners.setdefault(e.manifest.runner, []).append(e)
    return {runner: tuple(mine) for runner, mine in runners.items()}


def _grid(runner: str, entries: tuple[EntryView, ...]) -> Safe:
    families = _family_order(entries)
    rows = [el("tr", el("th", "entry"), join(el("th", f, data_family=f, data_backend=runner) for f in families))]
    for e in entries:
        cells = join(_cell(e.name, f, e.cells.get(f, Cell())) for f in families)
        rows.append(el("tr", el("th", e.name, el("div", e.plan_note, class_="note") if e.plan_note else "",
                                data_entry=e.name, data_backend=runner), cells))
    totals = [_total(entries, f) for f in families]
    rows.append(el("tr", el("th", "all entries"), join(el("td", t, class_="num") for t in totals)))
    title = el("h3", f"{runner}: {len(entries)} entries × {len(families)} graph families")
    return join([title, scrolled(el("table", join(rows), class_="matrix-grid", data_backend=runner))])


def scrolled(content: Safe) -> Safe:
    """A wide table scrolls inside its own box instead of widening the page."""
    return el("div", content, class_="scroll")


def _cell(entry: str, family: str, cell: Cell) -> Safe:
    lines: list[Any] = []
    if cell.planned:
        lines.append(el("b", f"{cell.planned - cell.missing}/{cell.planned}"))
        lines.append(" compiled")
    elif cell.compiled:
        lines += [el("b", cell.compiled), " compiled" + (" outside the plan" if cell.planned is not None else "")]
    if cell.missing:
        lines.append(el("div", f"{cell.missing} missing", class_="missing-count"))
    if cell.runtime:
        lines.append(el("div", f"+{cell.runtime} found at runtime"))
    if not lines:
        lines.append("—")
    words = (f"{family}: planned {cell.planned if cell.planned is not None else '?'}, compiled {cell.compiled}, "
             f"found at runtime {cell.runtime}, missing {cell.missing}")
    return el("td", join(lines), class_=f"cell {cell.state}", title=words, data_entry=entry, data_family=family,
              data_state=cell.state, data_planned=cell.planned, data_compiled=cell.compiled,
              data_runtime=cell.runtime, data_missing=cell.missing)


def _total(entries: tuple[EntryView, ...], family: str) -> str:
    cells = [e.cells[family] for e in entries if family in e.cells]
    compiled = sum(c.compiled + c.runtime for c in cells)
    missing = sum(c.missing for c in cells)
    return f"{compiled} graph(s)" + (f", {missing} missing" if missing else "")


def _compile_bars(data: BuildData) -> Safe:
    graphs = sorted(((g.compile_seconds, e.name, g) for e in data.entries for g in e.manifest.graphs
                     if g.compile_seconds > 0), key=lambda t: -t[0])
    if not graphs:
        return el("p", "no compile times recorded", class_="note")
    top = graphs[0][0]
    rows = [[entry, g.family, el("code", _shape_label(g.shape)), bar(s / top), el("span", f"{s:.2f}")]
            for s, entry, g in graphs[:TOP_GRAPHS]]
    rest = graphs[TOP_GRAPHS:]
    more = el("p", f"and {len(rest)} more graph(s), {sum(t[0] for t in rest):.1f} s in all", class_="note") \
        if rest else ""
    total = el("p", f"{len(graphs)} graphs, {sum(t[0] for t in graphs):.1f} s of XLA compiling in all")
    return join([total, table(["entry", "family", "shape", "", "seconds"], rows, id="compile-bars"), more])


def _shape_label(shape: dict[str, Any]) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in shape.items())


def _size_bars(data: BuildData) -> Safe:
    entries = sorted(data.entries, key=lambda e: -e.manifest.total_size)
    top = max(e.manifest.total_size for e in entries) or 1
    rows = [[e.name, bar(e.manifest.total_size / top), el("span", human_size(e.manifest.total_size)),
             len(e.manifest.files)] for e in entries]
    total = sum(e.manifest.total_size for e in entries)
    return join([table(["entry", "", "size", "files"], rows, id="cache-size"),
                 el("p", f"{human_size(total)} in {sum(len(e.manifest.files) for e in entries)} files")])


def _verify(data: BuildData) -> Safe:
    backends = [[name, count, el("span", words, class_=state, data_verdict=state)]
                for name, count, state, words in backend_verdicts(data.entries)]
    keys = [f.name for f in fields(VerifySummary)]
    rows = []
    for e in data.entries:
        state, words = verdict(e.manifest.verify, e.manifest.verify_unproven)
        values = [getattr(e.manifest.verify, k) for k in keys] if e.manifest.verify else ["—"] * len(keys)
        rows.append([e.name, f"{e.manifest.runner} on {e.manifest.device}", *values,
                     el("span", words, class_=state)])
    note = el("p", "Recorded by aotc verify in each manifest: misses = graphs the fresh server ran without a "
                   "cache entry; loadable = entries were really loaded (verify counted loads > 0 and no "
                   "deserialize failure).", class_="note")
    return join([el("h3", "per backend"), table(["backend", "entries", "verdict"], backends, id="verify-backends"),
                 el("h3", "per entry"), note,
                 table(["entry", "backend", *keys, "verdict"], rows, id="verify-entries")])


def _canary(data: BuildData) -> Safe:
    ran = [e for e in data.entries if e.canary]
    if not ran:
        return el("p", "no canary run", class_="note", id="canary-none")
    extra = sorted({k for e in ran for k in e.canary if k not in CANARY_FIGURES})  # type: ignore[union-attr]
    rows = [[e.name, *(_scalar(e.canary.get(k, "—")) for k in (*CANARY_FIGURES, *extra))]  # type: ignore[union-attr]
            for e in ran]
    rows += [[e.name, el("span", "no canary run", class_="note"), *[""] * (len(CANARY_FIGURES) + len(extra) - 1)]
             for e in data.entries if not e.canary]
    return table(["entry", *CANARY_FIGURES, *extra], rows, id="canary-figures")


def _scalar(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _inputs(data: BuildData) -> Safe:
    flat = [flatten(e.manifest.inputs) for e in data.entries]
    keys = sorted(set().union(*flat))
    differing = set(data.differing_inputs)
    rows = [el("tr", el("th", "input"), join(el("th", e.name) for e in data.entries))]
    rows += [el("tr", el("td", el("code", k)), join(el("td", el("code", _scalar(f.get(k, "<unset>"))))
                                                   for f in flat),
                class_="diff" if k in differing else None, data_input=k, data_differs=k in differing)
             for k in keys]
    if len(data.entries) == 1:
        summary = el("p", "one entry: nothing to compare", class_="note")
    elif differing:
        summary = el("p", "differ between entries: ", join(el("code", k, " ") for k in sorted(differing)),
                     id="inputs-differ")
    else:
        summary = el("p", "all entries have the same inputs", id="inputs-differ")
    fps = table(["entry", "fingerprint"], [[e.name, el("code", e.manifest.fingerprint)] for e in data.entries])
    return join([fps, summary, scrolled(el("table", join(rows), id="inputs-table"))])


# --- store page ------------------------------------------------------------------------------------


def html_store(data: StoreData) -> str:
    info = data.info
    title = "aotc store report"
    subtitle = f"{info.url} · {len(info.entries)} entries · generated {_fmt_time(data.generated)} UTC"
    return page(title, subtitle, [
        ("summary", "Sizes", _store_summary(data)),
        ("timeline", "Fingerprints over time", _timeline(data)),
        ("entries", "Entries", _store_entries(data)),
        ("gc", f"What gc --keep {data.gc.keep} --dry-run would free", _gc(data)),
    ])


def _store_summary(data: StoreData) -> Safe:
    info = data.info
    ratio = f"{data.dedup_ratio:.2f}×" if data.dedup_ratio else "—"
    unreferenced = info.size_on_store - data.referenced_size
    rows = [["entries", len(info.entries)], ["manifests (fingerprints)", data.manifests],
            ["objects", len(info.objects)], ["size on store", human_size(info.size_on_store)],
            ["sum of manifest sizes", human_size(data.logical_size)],
            ["deduplication ratio", el("span", ratio, id="dedup-ratio")],
            ["unreferenced objects", human_size(unreferenced)]]
    warnings = join(el("li", w, class_="warn") for w in info.warnings)
    return join([table(None, rows, id="store-summary"),
                 el("p", "Deduplication: the sum of manifest sizes over the bytes of the distinct objects they "
                         "reference.", class_="note"),
                 el("ul", warnings) if info.warnings else ""])


def _stamps(data: StoreData) -> list[float]:
    """Creation times that parse (an unparseable one reads as 0.0 and is left off the charts)."""
    return sorted(m.created_ts for e in data.info.entries for m in e.manifests if m.created_ts)


def _span(data: StoreData) -> tuple[float, float]:
    stamps = _stamps(data)
    if not stamps:
        return 0.0, 1.0
    low, high = min(stamps), max(stamps)
    return low, high if high > low else low + 1.0


def _timeline(data: StoreData) -> Safe:
    """Cumulative fingerprints published, as a step line over the manifests' creation times."""
    stamps = _stamps(data)
    if not stamps:
        return el("p", "no dated fingerprints in the store", class_="note")
    low, high = _span(data)
    width, height, n = 720, 160, len(stamps)
    points = " ".join(f"{(t - low) / (high - low) * width:.1f},{height - (i + 1) / n * height:.1f}"
                      for i, t in enumerate(stamps))
    svg = el("svg", el("polyline", points=points, fill="none", stroke="#0969da", stroke_width="2"),
             el("text", f"{n} fingerprints", x="4", y="14", font_size="12"),
             viewBox=f"0 -4 {width} {height + 8}", width=str(width), height=str(height + 8),
             role="img", aria_label="cumulative fingerprints published over time")
    axis = el("p", f"{_stamp(low)} → {_stamp(high)}", class_="note")
    return join([svg, axis])


def _stamp(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M")


def _store_entries(data: StoreData) -> Safe:
    low, high = _span(data)
    rows = []
    for entry in data.info.entries:
        newest = entry.manifests[0] if entry.manifests else None
        history = join(el("div", el("code", m.fingerprint[:12]), f" {_fmt_time(m.created)}",
                              " (ref)" if m.fingerprint == entry.ref else "") for m in entry.manifests)
        rows.append(el("tr", el("td", entry.name), el("td", len(entry.manifests), class_="num"),
                       el("td", _sparkline(entry.manifests, entry.ref, low, high)), el("td", history),
                       el("td", newest.size_str if newest else "—", class_="num"),
                       el("td", newest.file_count if newest else 0, class_="num"), data_entry=entry.name))
    head = el("tr", join(el("th", h) for h in ("entry", "fingerprints", "when", "history (newest first)",
                                                "size", "files")))
    return el("table", el("thead", head), el("tbody", join(rows)), id="store-entries")


def _sparkline(manifests: tuple, ref: str | None, low: float, high: float) -> Safe:
    width = 160
    dots = join(el("circle", cx=f"{(m.created_ts - low) / (high - low) * (width - 8) + 4:.1f}", cy="7", r="4",
                   fill="#1a7f37" if m.fingerprint == ref else "#8c959f") for m in manifests if m.created_ts)
    return el("svg", dots, width=str(width), height="14", viewBox=f"0 0 {width} 14")


def _gc(data: StoreData) -> Safe:
    gc = data.gc
    rows = [["manifests to delete", len(gc.manifests_to_delete)],
            ["objects to delete", len(gc.objects_to_delete)],
            ["would free", el("span", gc.expected_freed_size_str, id="gc-freed")],
            [f"unreferenced objects younger than {gc.min_age:.0f} s (kept)", len(gc.objects_too_new)],
            ["temporary files to delete", len(gc.temp_files_to_delete)],
            ["refs to rewrite", len(gc.refs_to_rewrite)]]
    doomed = [[m.entry, el("code", m.fingerprint[:16]), _fmt_time(m.created), m.size_str]
              for m in gc.manifests_to_delete[:MAX_GC_ROWS]]
    more = len(gc.manifests_to_delete) - len(doomed)
    parts = [table(None, rows, id="gc-summary")]
    if doomed:
        parts.append(table(["entry", "fingerprint", "created", "size"], doomed, id="gc-manifests"))
    if more:
        parts.append(el("p", f"and {more} more manifest(s)", class_="note"))
    parts += [el("p", w, class_="warn") for w in gc.warnings if w not in data.info.warnings]
    return join(parts)


# --- output ----------------------------------------------------------------------------------------


def write_report(text: str, out: str | Path) -> Path:
    """Write atomically: a CI upload or a browser never sees half a page (aotc/files.py: replace_file)."""
    return replace_file(out, text.encode("utf-8"))
