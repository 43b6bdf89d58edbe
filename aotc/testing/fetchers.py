"""Many ``aotc fetch`` processes sharing one node cache at once, as the pods of one node do (tests, bench)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aotc
from aotc.manifest import Manifest
from aotc.testing.artifacts import expected_dest, random_files, tree

REPO = Path(aotc.__file__).resolve().parents[1]


@dataclass(frozen=True)
class RoundResult:
    fetches: int
    failures: tuple[str, ...]  # one line per fetch that exited non-zero: its dest, code and last stderr line
    hangs: int  # fetches still running at the round's timeout (killed)
    mismatched: int  # fetches that exited 0 with a dest not byte-equal to the artifact
    seconds: float

    @property
    def ok(self) -> bool:
        return not (self.failures or self.hangs or self.mismatched)


def overlapping_files(entries: int, shared: int = 12, own: int = 6, seed: int = 0) -> list[dict[str, bytes]]:
    """Files for ``entries`` artifacts: ``shared`` files common to all (one object each on a node), ``own``
    files each."""
    common = random_files(shared, seed=seed, low=16 << 10, high=256 << 10)
    return [common | random_files(own, seed=seed + 1 + i, low=16 << 10, high=256 << 10, prefix=f"tp1_rank{i}")
            for i in range(entries)]


def concurrent_fetches(url: str, artifacts: list[Path], cache: Path, dests: Path, count: int, timeout: float,
                       *extra: str) -> RoundResult:
    """``count`` fetches at once (artifact ``i % len(artifacts)`` into ``dests/pod<i>``), one cache."""
    started = time.monotonic()
    env = {**os.environ, "AOTC_NO_PROGRESS": "1"}
    runs = []
    for i in range(count):
        art, dest = artifacts[i % len(artifacts)], dests / f"pod{i}"
        args = ["fetch", "--fingerprint", Manifest.load(art).fingerprint, "--dest", str(dest), "--store", url,
                "--cache-dir", str(cache), *extra]
        runs.append((art, dest, subprocess.Popen([sys.executable, "-m", "aotc.cli", *args], cwd=REPO, env=env,
                                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)))
    failures, hangs, mismatched = [], 0, 0
    for art, dest, proc in runs:
        try:
            _, err = proc.communicate(timeout=max(0.1, started + timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            hangs += 1
            continue
        if proc.returncode:
            failures.append(f"{dest}: exit {proc.returncode}: {(err.strip().splitlines() or [''])[-1]}")
        elif tree(dest) != expected_dest(art):
            mismatched += 1
    return RoundResult(count, tuple(failures), hangs, mismatched, time.monotonic() - started)
