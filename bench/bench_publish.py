"""Publish benchmark on loopback: `publish_artifacts` of one artifact into a fresh store, interleaved rounds.

    python bench/bench_publish.py                # demo-sized: 19 files, ~1.3 MB (the torch_xla demo's cache)
    python bench/bench_publish.py --scale 0.25   # bench_fetch.py's artifact shape (300 files) at a quarter size

Each round publishes the same artifact into a new bucket of the loopback fake-gcs-server, reached through
aotc/testing/faultproxy.py in its own process (``--latency`` seconds per request), then into a new local
folder: every object is uploaded and checked each time. Wall and CPU per run as in bench_fetch.py
(client: this process; harness: server + proxy). To compare two versions of aotc, run this file from each
checkout alternately (it imports the aotc of the checkout it sits in).
"""

from __future__ import annotations

import os

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import argparse
import shutil
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_fetch.py's harness
from bench_fetch import MB, LoopbackGcs, Run, synthetic_files, timed  # noqa: E402

from aotc.publish import publish_artifacts  # noqa: E402
from aotc.store import Store  # noqa: E402
from aotc.testing.artifacts import make_artifact, random_files  # noqa: E402


def demo_files() -> dict[str, bytes]:
    """19 files of 16-120 KiB: the torch_xla demo's cache (docs/backends/vllm-tpu.md: 19 cache files, 1.3 MB)."""
    return random_files(19, seed=1, low=16 << 10, high=120 << 10)


def summary(label: str, runs: list[Run]) -> None:
    walls = [r.wall for r in runs]
    print(f"{label:<20} best {min(walls):6.3f} s  median {statistics.median(walls):6.3f} s  "
          f"client CPU median {statistics.median(r.client_cpu for r in runs):6.3f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=0.0,
                        help="bench_fetch's 300-file artifact at this size factor (default: the demo-sized one)")
    parser.add_argument("--latency", type=float, default=0.03, help="seconds the proxy adds per request")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="aotc-bench-publish-"))
    gcs = LoopbackGcs(args.latency)
    server, proxy_url, harness = gcs.server, gcs.proxy_url, gcs.pids
    try:
        files = synthetic_files(args.scale) if args.scale else demo_files()
        art = make_artifact(scratch / "artifacts", entry="bench--len2048-tp1", files=files)
        print(f"artifact: {len(files)} files, {sum(map(len, files.values())) / MB:.1f} MiB; proxy latency "
              f"{args.latency * 1000:.0f} ms; {os.cpu_count()} cores", flush=True)
        del files
        to_gcs: list[Run] = []
        to_folder: list[Run] = []
        for _ in range(args.rounds):
            bucket = server.make_bucket(f"bench-{uuid.uuid4().hex[:8]}")
            store = Store.from_url(f"gs://{bucket}/store", endpoint_url=proxy_url, token="anon")
            to_gcs.append(timed("publish to GCS (through the proxy)",
                             lambda: publish_artifacts([str(art)], store.url, store=store), harness))
            folder = str(scratch / f"store-{uuid.uuid4().hex[:8]}")
            to_folder.append(timed("publish to a local folder", lambda: publish_artifacts([str(art)], folder), harness))
            shutil.rmtree(folder)
        summary("GCS", to_gcs)
        summary("local folder", to_folder)
    finally:
        gcs.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
