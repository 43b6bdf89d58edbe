"""Shared by the canary tests of both backends: publish an artifact (optionally with one cache file
deleted) into a store of its own, and run the real `aotc canary` CLI against it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from aotc.manifest import Manifest


def publish_copy(artifact: Path, work: Path, env: dict, drop_family: str | None = None) -> tuple[Path, str | None]:
    """A store holding ``artifact``; with ``drop_family``, one cache file of that family's first graph is
    gone from the published artifact (its manifest still names the graph). Returns (store, dropped key)."""
    copy = work / "artifact" / artifact.name
    shutil.copytree(artifact, copy)
    dropped = None
    if drop_family:
        manifest = json.loads((copy / "manifest.json").read_text())
        [graph, *_] = [g for g in manifest["graphs"] if g["family"] == drop_family and g["keys"]]
        dropped = graph["keys"][0]
        (copy / "cache" / dropped).unlink()
        manifest["files"] = [f for f in manifest["files"] if f["path"] != dropped]
        (copy / "manifest.json").write_text(json.dumps(manifest, indent=1))
        Manifest.load(copy)  # still a valid manifest
    store = work / "store"
    proc = subprocess.run([sys.executable, "-m", "aotc.cli", "publish", str(copy), "--store", str(store)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return store, dropped


def canary(config: Path, entry: str, store: Path, env: dict, requests: int = 16) -> tuple[int, dict, str]:
    from tests.helpers.support_records import saw

    args = ["canary", str(config), "--entry", entry, "--store", str(store), "--requests", str(requests), "--json"]
    proc = subprocess.run([sys.executable, "-m", "aotc.cli", *args], capture_output=True, text=True, env=env,
                          timeout=1800)
    saw(args, proc.stdout)
    doc = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, doc, proc.stderr


def assert_kinds_served(doc: dict, lacking: set[str]) -> None:
    """Every request kind went out and was served, or refused by the stack (its limitation, listed with the
    stack's message); none failed but those AOTC_GUARD=strict failed for a cached graph the stack compiled
    again (torch_xla 2.9.0 cannot load its cache). Not sent: the kinds the entry is ``lacking`` the means for,
    and those using an option the runner's stock server cannot serve (RunnerSpec.unserved)."""
    from aotc.canary_requests import KINDS
    from aotc.runners.spec import load_runner

    kinds = doc["kinds"]
    assert set(kinds) == {kind.name for kind in KINDS}
    unserved = {kind.name for kind in KINDS if set(kind.options) & set(load_runner(doc["runner"]).unserved)}
    assert {name for name, kind in kinds.items() if kind["not_sent"]} == lacking | unserved, kinds
    assert sum(kind["failed"] for kind in kinds.values()) <= doc["strict_failed_cached"], kinds
    for name, kind in kinds.items():
        assert kind["ok"] + kind["rejected"] + kind["failed"] == kind["sent"], (name, kind)
        assert kind["not_sent"] or kind["sent"] > 0, (name, kind)
        if kind["rejected"]:
            assert f"{name} rejected by the stack: {kind['rejected_by_stack']}" in doc["limitations"]


def summary(doc: dict) -> str:
    """One line per kind: the figures a person reads off a canary run."""
    lines = [f"canary {doc.get('entry')}: {doc.get('requests')} requests, {doc.get('failed_requests')} failed, "
             f"{doc.get('compiles_after_ready')} compiles after ready, bench {doc.get('bench', {}).get('duration')} s, "
             f"prefix cache {doc.get('prefix_cache')}"]
    for name, kind in doc.get("kinds", {}).items():
        lines.append(f"  {name}: " + (f"not sent ({kind['not_sent']})" if kind["not_sent"] else
                                      f"{kind['ok']}/{kind['sent']} ok" + (f", refused: {kind['rejected_by_stack']}"
                                                                           if kind["rejected"] else "")
                                      + (f", failed: {kind['errors']}" if kind["failed"] else "")))
    return "\n".join(lines)
