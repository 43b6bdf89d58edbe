"""What the support table's slow tests measured, kept as small JSON records when $AOTC_SUPPORT_RECORDS names a
directory (off by default): the helpers that run `aotc build|verify|canary --json` hand each output to
``saw``, and when a test that tests/support_cases.py names as an entry's evidence passes, each stage it proves
is written as <dir>/<matrix>/<entry>.<stage>.json with that entry's last figures. `make support-table` renders
them as the "Last measured" column (tests/support_table.py)."""

from __future__ import annotations

import json
import os
import time
from functools import cache
from pathlib import Path

import pytest

RECORDS_ENV = "AOTC_SUPPORT_RECORDS"
# (stage, entry name) -> the figures of this process's last output of that command for that entry
_seen: dict[tuple[str, str], dict] = {}


def records_dir() -> Path | None:
    value = os.environ.get(RECORDS_ENV, "")
    return Path(value) if value else None


def figures(stage: str, doc: dict) -> dict[str, dict]:
    """Entry name -> the figures the table shows, from one `aotc <stage> --json` output."""
    if stage == "build":
        return {e["entry"]: {"planned": e.get("planned"), "built": e.get("graphs_with_keys")}
                for e in doc.get("entries", []) if "entry" in e}
    if stage == "verify":
        return {doc["entry"]: {"misses": doc.get("misses"), "requests": doc.get("traffic_requests"),
                               "loadable": doc.get("loadable")}}
    if stage == "canary":
        serving = doc.get("serving") or {}
        return {doc["entry"]: {"compiles_after_ready": doc.get("compiles_after_ready"),
                               "requests": doc.get("requests"), "loadable": doc.get("loadable"),
                               "new_files_after_ready": len(serving.get("new_files") or [])}}
    return {}


def saw(args, stdout: str) -> None:
    """Keep the figures of a CLI run's JSON output, when records are on (a no-op otherwise)."""
    args = [str(a) for a in args]
    if records_dir() is None or not args or "--json" not in args:
        return
    try:
        doc = json.loads(stdout)
    except ValueError:
        return
    if isinstance(doc, dict):
        for entry, figs in figures(args[0], doc).items():
            _seen[(args[0], entry)] = figs


@cache
def evidence() -> dict:
    from tests.support_cases import stages_of_tests

    return stages_of_tests()


def write_records(nodeid: str, directory: Path) -> list[Path]:
    written = []
    for suite, entry, stage in evidence().get(nodeid, []):
        path = directory / suite.name / f"{entry.name}.{stage}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"test": nodeid, "date": time.strftime("%Y-%m-%d", time.gmtime()),
                  **_seen.get((stage, entry.name), {})}
        path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        written.append(path)
    return written


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    directory = records_dir()
    if directory is not None and report.when == "call" and report.passed:
        write_records(item.nodeid, directory)
    return report
