"""Probe windows -> the families, shapes and keys the core talks about. Pure data (no JAX)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aotc.runners.protocol import ROW_FIELDS

Record = dict[str, Any]
STARTUP = "startup"
RUNTIME = "runtime"


def touched(record: Record) -> list[str]:
    """Cache files a window wrote or read back."""
    return sorted(set(record["written"]) | set(record["found"]))


def is_call(record: Record) -> bool:
    return record["kind"] == "call"


def family_of(record: Record) -> str:
    if is_call(record):
        return record["family"]
    return RUNTIME if record["kind"] == "step" or record["phase"] == RUNTIME else STARTUP


def compile_seconds(records: Iterable[Record]) -> float:
    return round(sum(r["compile_seconds"] for r in records), 3)


def graphs_outside_calls(records: list[Record], family: str) -> list[dict[str, Any]]:
    """Startup or runtime windows that wrote cache files: graphs the plan does not list by shape."""
    return [{"family": family, "shape": r["shape"] or {"what": r["family"]}, "keys": sorted(r["written"]),
             "compile_seconds": r["compile_seconds"]}
            for r in records if not is_call(r) and family_of(r) == family and r["written"]]


def family_table(records: list[Record], new_files: dict[str, int], always: Iterable[str] = ()) -> dict[str, dict]:
    """Per family: compile requests, entries found (loaded, or found and not loadable here: JAX then compiles
    and writes the same key again), loads (persistent-cache hits: JAX deserializes every entry it loads),
    misses, writes, ..."""
    table = {name: dict.fromkeys(ROW_FIELDS, 0) for name in always}
    for r in records:
        row = table.setdefault(family_of(r), dict.fromkeys(ROW_FIELDS, 0))
        found = r["hits"] + len(r["unloadable"])
        row["requests"] += r["requests"]
        row["found"] += found
        row["loads"] += r["hits"]
        row["misses"] += r["requests"] - found
        row["writes"] += r["writes"]
        row["compiles"] += r["backend_compiles"] - r["hits"]
        row["uncached_compiles"] += r["backend_compiles"] - r["requests"]
        row["deserialize_failures"] += r["deserialize_failures"]
    for family, count in new_files.items():
        table.setdefault(family, dict.fromkeys(ROW_FIELDS, 0))["new_files"] += count
    return table


def totals(table: dict[str, dict]) -> dict[str, int]:
    return {f: sum(row[f] for row in table.values()) for f in ROW_FIELDS}
