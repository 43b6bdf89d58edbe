"""The canary's evidence and its verdict: the private cache's files before start-up, at ready and at the end
(a new file is a graph the artifact lacks; a rewritten one a cached graph compiled again, torch_xla 2.9.0's
case), the runner's own cache log by phase, and what the run adds up to. Exit 0 only if nothing compiled
that the artifact lacks; on a stack whose cache does not load, recompiles of cached graphs are counted and
reported under the loadability verdict, never a pass for loading."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aotc.canary_send import KindOutcome
from aotc.manifest import Manifest

LOADABILITY_REFERENCE = "pytorch/xla#9094"


@dataclass
class Snapshot:
    """name -> (size, mtime_ns) of every cache file."""

    files: dict[str, tuple[int, int]]

    @classmethod
    def of(cls, root: Path) -> Snapshot:
        files = {}
        for path in root.rglob("*"):
            if path.is_file() and path.name != "manifest.json":
                st = path.stat()
                files[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
        return cls(files)

    def new_since(self, before: Snapshot) -> list[str]:
        return sorted(set(self.files) - set(before.files))

    def rewritten_since(self, before: Snapshot) -> list[str]:
        return sorted(k for k in self.files.keys() & before.files.keys() if self.files[k] != before.files[k])


@dataclass
class Phase:
    """What one phase (start-up, or serving after ready) compiled."""

    new_files: list[str] = field(default_factory=list)
    rewritten_files: list[str] = field(default_factory=list)
    lookups: int | None = None
    hits: int | None = None
    misses: list[str] = field(default_factory=list)

    @property
    def missing(self) -> list[str]:
        """Cache keys compiled that the artifact lacks (files, and log misses the files do not show)."""
        return sorted(set(self.new_files) | set(self.misses))


@dataclass
class CanaryResult:
    entry: str
    runner: str
    fingerprint: str
    loadable: bool | None
    requests: int = 0
    failed_requests: int = 0
    ready_seconds: float | None = None
    startup: Phase = field(default_factory=Phase)
    serving: Phase = field(default_factory=Phase)
    graphs_missing: list[str] = field(default_factory=list)
    guard: dict[str, float] | None = None
    prefix_cache: dict[str, float] | None = None
    """The server's own prefix-cache counters at the end, in prompt tokens: {"queries", "hits"} (vLLM's
    vllm:prefix_cache_queries / _hits). Hits show the shared-prefix requests took cached blocks (and, on a
    hybrid model, the recurrent state saved with them)."""
    bench: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    """What kept the canary from judging: the load generator failed, the server died."""
    failures: list[str] = field(default_factory=list)
    """A sample of the failed requests' errors."""
    adapters: list[str] = field(default_factory=list)
    """LoRA adapters the requests named besides the base model (one loaded at run time among them)."""
    limitations: list[str] = field(default_factory=list)
    """Request options not driven because the stock server of this stack cannot serve them (RunnerSpec.unserved),
    and request kinds the stack refused, with its message."""
    kinds: dict[str, KindOutcome] = field(default_factory=dict)
    """Per request kind (aotc/canary_requests.py): what was sent and how the server answered."""

    @property
    def compiles_at_startup(self) -> int:
        return len(self.startup.missing) + len(self.startup.rewritten_files)

    @property
    def compiles_after_ready(self) -> int:
        return len(self.serving.missing) + len(self.serving.rewritten_files)

    @property
    def strict_failed_cached(self) -> int:
        """Requests AOTC_GUARD=strict failed because their step compiled a graph the cache holds (a stack
        that cannot load it, torch_xla 2.9.0): the loadability verdict's, not coverage's. 0 unless every
        compile the guard saw after ready was of a cached graph."""
        guard = self.guard or {}
        after = {k: v for k, v in guard.items() if k.startswith("aotc_compiles_after_ready_total")}
        if not after or any(v and 'family="cached"' not in k for k, v in after.items()):
            return 0
        return int(guard.get("aotc_requests_failed_total", 0))

    @property
    def unexplained_failures(self) -> int:
        return max(0, self.failed_requests - self.strict_failed_cached)

    @property
    def ok(self) -> bool:
        return not self.graphs_missing and not self.unexplained_failures and not self.problems

    @property
    def verdict(self) -> str:
        if not self.ok:
            named = "; ".join(self.graphs_missing[:10]) or "; ".join(p.splitlines()[0] for p in self.problems[:3])
            return f"{self.runner}: FAILED: {named or f'{self.unexplained_failures} failed request(s): {self.failures[:1]}'}"
        recompiled = len(self.startup.rewritten_files) + len(self.serving.rewritten_files)
        if recompiled:
            failed = (f"; AOTC_GUARD=strict failed {self.failed_requests} request(s) whose step recompiled one"
                      if self.failed_requests else "")
            return (f"{self.runner}: every graph covered over {self.requests} requests; {recompiled} recompiled "
                    f"because this stack cannot load its cache ({LOADABILITY_REFERENCE}){failed}")
        return f"{self.runner}: 0 compiles after ready over {self.requests} requests"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(ok=self.ok, verdict=self.verdict, compiles_at_startup=self.compiles_at_startup,
                    compiles_after_ready=self.compiles_after_ready, strict_failed_cached=self.strict_failed_cached)
        return data


def phase_between(before: Snapshot, after: Snapshot, log_text: str, cache_log: dict[str, Any]) -> Phase:
    p = Phase(new_files=[cache_key(f) for f in after.new_since(before)],
              rewritten_files=[cache_key(f) for f in after.rewritten_since(before)])
    if cache_log.get("hit"):
        hits = re.findall(cache_log["hit"], log_text)
        misses = re.findall(cache_log["miss"], log_text)
        p.lookups, p.hits = len(hits) + len(misses), len(hits)
        p.misses = sorted({key for _, key in misses})
    return p


def cache_key(path: str) -> str:
    """A cache file's key: its name without the stack's suffix (JAX writes ``<key>-cache``)."""
    return path.removesuffix("-cache")


def name_graphs(manifest: Manifest, keys: Iterable[str]) -> list[str]:
    """``family {shape} (key)`` for keys the manifest's graphs name, else the key itself."""
    by_key = {}
    for graph in manifest.graphs:
        for key in graph.keys:
            by_key[cache_key(Path(key).name)] = f"{graph.family} {json.dumps(graph.shape, sort_keys=True)}"
    names = []
    for key in sorted(set(keys)):
        base = Path(key).name
        names.append(f"{by_key[base]} ({base[:60]})" if base in by_key else base[:100])
    return names
