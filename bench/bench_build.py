"""Build benchmark: overhead over pure XLA compile time, and --jobs 2 against --jobs 1.

Figures are printed as ratios from one run, side by side; nothing here is a pass/fail test.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from aotc.build import build_matrix
from aotc.matrix import load_matrix

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def timed_build(config: Path, jobs: int, traffic: int):
    with tempfile.TemporaryDirectory(prefix="aotc-bench-") as out:
        start = time.perf_counter()
        report = build_matrix(load_matrix(config), out_dir=out, jobs=jobs, traffic=traffic)
        wall = time.perf_counter() - start
    if not report.ok:
        raise SystemExit(f"build failed: {[e.error for e in report.entries if not e.ok]}")
    return wall, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traffic", type=int, default=16)
    args = parser.parse_args()

    wall, report = timed_build(REPO / "configs" / "demo.yaml", 1, args.traffic)
    entry = report.entries[0]
    print(f"demo build: wall {wall:.1f}s, runner-reported XLA compile {entry.compile_seconds:.1f}s, "
          f"overhead ratio (wall / compile) = {wall / max(entry.compile_seconds, 1e-9):.2f}  (aim <= 1.10)")

    one, _ = timed_build(HERE / "two-entries.yaml", 1, args.traffic)
    two, _ = timed_build(HERE / "two-entries.yaml", 2, args.traffic)
    print(f"two entries: --jobs 1 {one:.1f}s, --jobs 2 {two:.1f}s, speed-up = {one / two:.2f}x  (aim >= 1.7x)")


if __name__ == "__main__":
    main()
