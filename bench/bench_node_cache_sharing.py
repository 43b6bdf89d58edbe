"""Pods sharing one node cache: N concurrent `aotc fetch --cache-dir` processes, R rounds, counted.

    python bench/bench_node_cache_sharing.py                     # 8 and 32 fetchers, 20 rounds each
    python bench/bench_node_cache_sharing.py --fetchers 8 --rounds 3

Three artifacts that share most of their files are published to a local-folder store; each round starts
N fetches at once, artifact i % 3 into its own dest, all through one cache bounded to half of what the three
reference (so eviction runs while others insert and serve). Even rounds start from an empty cache (every
object inserted while others wait on its lock), odd rounds from the previous round's (served, evicted).
A fetch counts as a failure when it exits non-zero, a hang when it is still running after --timeout, a
mismatch when its dest is not byte-equal to the artifact. Figures only; the suite's quick variant is
tests/store/test_node_cache_sharing.py.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from aotc.manifest import Manifest  # noqa: E402
from aotc.testing.artifacts import make_artifact  # noqa: E402
from aotc.testing.fetchers import concurrent_fetches, overlapping_files  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fetchers", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a round may take before a hang")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="aotc-sharing-"))
    try:
        store = str(scratch / "store")
        arts = [make_artifact(scratch / "art", entry=f"e{i}--x", files=files)
                for i, files in enumerate(overlapping_files(3))]
        subprocess.run([sys.executable, "-m", "aotc.cli", "publish", *map(str, arts), "--store", store],
                       cwd=REPO, check=True, capture_output=True)
        union = {f.sha256: f.size for art in arts for f in Manifest.load(art).files}
        bound = str(sum(union.values()) // 2)
        print(f"3 artifacts, {len(union)} distinct objects, {sum(union.values()) / 1e6:.1f} MB; cache bound "
              f"{int(bound) / 1e6:.1f} MB", flush=True)
        for count in args.fetchers:
            totals = {"fetches": 0, "failures": 0, "hangs": 0, "mismatched": 0}
            seconds = []
            cache = scratch / f"cache-{count}"
            for round_ in range(args.rounds):
                if round_ % 2 == 0:
                    shutil.rmtree(cache, ignore_errors=True)
                dests = scratch / f"dests-{count}-{round_}"
                result = concurrent_fetches(store, arts, cache, dests, count, args.timeout,
                                            "--cache-max-size", bound)
                shutil.rmtree(dests, ignore_errors=True)
                totals["fetches"] += result.fetches
                totals["failures"] += len(result.failures)
                totals["hangs"] += result.hangs
                totals["mismatched"] += result.mismatched
                seconds.append(result.seconds)
                for line in result.failures:
                    print(f"  round {round_}: {line}", flush=True)
            print(f"{count} fetchers x {args.rounds} rounds: {totals['fetches']} fetches, {totals['failures']} "
                  f"failures, {totals['hangs']} hangs, {totals['mismatched']} dests not byte-equal; a round "
                  f"took {min(seconds):.1f}-{max(seconds):.1f} s", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
