"""``aotc verify``: a fresh process replays the buckets and random traffic on a read-only copy of the
cache, and the verdict rests on what was compiled, not on what was hoped.

Coverage and loadability are separate claims. ``misses == 0`` means every graph the server ran had
its cache entry; ``loadable`` is true only when entries were really loaded. On torch_xla 2.9.0 the
honest result is "covered, not loadable" (pytorch/xla#9094): the entries exist but cannot be
deserialized, so a pod still compiles them.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aotc.build import RunnerFailed, run_runner
from aotc.errors import BadInput, CheckFailed
from aotc.manifest import CACHE_DIR_NAME, VERIFY_UNPROVEN, Manifest, VerifySummary
from aotc.matrix import Entry
from aotc.plan import plan_entry
from aotc.runners.protocol import FamilyRow
from aotc.runners.protocol import VerifyResult as RunnerVerify


@dataclass(frozen=True)
class VerifyReport:
    artifact_dir: str
    entry: str
    fingerprint: str
    families: dict[str, FamilyRow]
    misses: int
    missed: tuple[dict[str, Any], ...]
    replayed_graphs: int
    traffic_requests: int
    loadable: bool
    evidence: str = ""
    seed: int = 0
    warnings: tuple[str, ...] = field(default_factory=tuple)
    problem: str | None = None  # the runner's own failure verdict, e.g. a compile that bypassed the cache
    unproven: str | None = None  # why this host cannot show a load (a TPU artifact on a host without a TPU)

    @property
    def ok(self) -> bool:
        return self.misses == 0 and not self.problem

    @property
    def verdict(self) -> str:
        if self.misses:
            families = sorted({m["family"] for m in self.missed}) or sorted(
                f for f, c in self.families.items() if c.misses)
            return f"NOT COVERED: {self.misses} graph(s) missed the cache ({', '.join(families)})"
        if self.problem:
            return f"NOT COVERED: {self.problem}"
        if self.loadable:
            return "covered and loadable: every graph was found in the cache and loaded"
        if self.unproven:
            return f"covered, loadability unproven: every graph's key was found in the cache; {self.unproven}"
        return ("covered, not loadable: every graph was found in the cache, but this stack could not load "
                "the entries (torch_xla 2.9.0, pytorch/xla#9094), so a server still compiles them")

    def summary(self) -> VerifySummary:
        return VerifySummary(misses=self.misses, replayed_graphs=self.replayed_graphs,
                             traffic_requests=self.traffic_requests, loadable=self.loadable)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "verdict": self.verdict, "artifact_dir": self.artifact_dir, "entry": self.entry,
                "fingerprint": self.fingerprint, "misses": self.misses, "missed": list(self.missed),
                "replayed_graphs": self.replayed_graphs, "traffic_requests": self.traffic_requests,
                "loadable": self.loadable, "unproven": self.unproven, "seed": self.seed, "evidence": self.evidence,
                "problem": self.problem,
                "families": {k: v.model_dump() for k, v in self.families.items()}, "warnings": list(self.warnings)}


def entry_from_manifest(manifest: Manifest) -> Entry:
    build = manifest.extra.get("build", {})
    if "entry" not in build:
        raise BadInput(f"manifest of {manifest.entry} has no build section; rebuild it with this aotc")
    return Entry.from_dict(build["entry"])


def verify_artifact(artifact_dir: str | Path, traffic: int = 64, seed: int = 1, record: bool = True) -> VerifyReport:
    artifact = Path(artifact_dir)
    manifest = Manifest.load(artifact)
    if not (artifact / CACHE_DIR_NAME).is_dir():
        raise BadInput(f"{artifact}: no {CACHE_DIR_NAME}/ directory")
    plan = plan_entry(entry_from_manifest(manifest))
    with tempfile.TemporaryDirectory(prefix="aotc-verify-") as work:
        try:
            raw = run_runner("verify", plan, artifact / CACHE_DIR_NAME, Path(work), traffic=traffic, seed=seed)
        except RunnerFailed as exc:
            raise CheckFailed(str(exc)) from None
        if raw.error and not raw.families:
            raise CheckFailed(f"{manifest.entry}: verify could not run: {raw.error}")
    result = _result(artifact, manifest, raw, seed)
    if record:
        extra = {k: v for k, v in manifest.extra.items() if k != VERIFY_UNPROVEN}
        if result.unproven:
            extra[VERIFY_UNPROVEN] = result.unproven
        replace(manifest, verify=result.summary(), extra=extra).save(artifact)
    return result


def _result(artifact: Path, manifest: Manifest, raw: RunnerVerify, seed: int) -> VerifyReport:
    families = raw.families
    misses = max(raw.misses, sum(c.misses for c in families.values()))
    loads = sum(c.loads for c in families.values())
    failures = sum(c.deserialize_failures for c in families.values())
    # never report a load that did not happen, whatever the runner believed
    loadable = raw.loadable and loads > 0 and failures == 0
    return VerifyReport(artifact_dir=str(artifact), entry=manifest.entry, fingerprint=manifest.fingerprint,
                        families=families, misses=misses, missed=tuple(m.model_dump() for m in raw.missed),
                        replayed_graphs=raw.replayed_graphs, traffic_requests=raw.traffic_requests, loadable=loadable,
                        evidence=raw.evidence, seed=seed, warnings=tuple(raw.warnings),
                        problem=None if misses else raw.error, unproven=None if loadable else raw.unproven)
