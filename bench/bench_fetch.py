"""Fetch benchmark on loopback: aotc fetch against three baselines, through a proxy adding latency.

    python bench/bench_fetch.py              # ~300 files / 1.1 GB (five of 150 MB, the rest 0.1-2 MB)
    python bench/bench_fetch.py --size 0.1   # every file a tenth as large, for a quick run

A fake-gcs-server (memory backend) sits behind aotc/testing/faultproxy.py (its own process, ``--latency``
seconds added to every request). The artifact is published straight to the server; every measurement
reads through the proxy:

  (a) naive      a sequential loop of gcsfs ``get_file``, one object at a time
  (b) gcsfs get  gcsfs' own ``get(recursive=True)`` of the objects (parallel, no verification)
  (c) raw read   the same objects read in parallel ranges, nothing written or hashed (the ceiling)
  (d) aotc       ``fetch_artifact``: parallel ranged reads, sha256 while streaming, atomic placement
  (e) node cache ``fetch_artifact`` with a node cache: once cold (download + insert), then warm into a
                 second dest (a second pod on the node: nothing downloaded, objects hard-linked)
"""

from __future__ import annotations

import os

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import argparse
import asyncio
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from aotc.fetch import CHUNK_SIZE, DEFAULT_WORKERS, fetch_artifact  # noqa: E402
from aotc.manifest import Manifest  # noqa: E402
from aotc.publish import publish_artifacts  # noqa: E402
from aotc.store import Store  # noqa: E402
from aotc.store.cache import NodeCache  # noqa: E402
from aotc.testing.artifacts import make_artifact  # noqa: E402
from aotc.testing.gcs_server import FakeGcs  # noqa: E402

MB = 1 << 20


def synthetic_files(scale: float, seed: int = 0) -> dict[str, bytes]:
    """Five 150 MB files and 295 of 0.1-2 MB, all sizes times ``scale``; random, so nothing dedups."""
    rng = random.Random(seed)
    sizes = [150 * MB] * 5 + [rng.randint(MB // 10, 2 * MB) for _ in range(295)]
    return {f"tp1_rank0/{i:04d}-{rng.getrandbits(48):012x}": os.urandom(max(1, int(s * scale)))
            for i, s in enumerate(sizes)}


def start_proxy(upstream: str, latency: float) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "aotc.testing.faultproxy", "--upstream", upstream,
                             "--latency", str(latency)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().split()
    if line[:1] != ["READY"]:
        proc.kill()
        raise RuntimeError("fault proxy did not start")
    return proc, f"http://127.0.0.1:{line[1]}"


def timed(label: str, fn) -> float:
    started = time.perf_counter()
    fn()
    seconds = time.perf_counter() - started
    print(f"  {label:<34} {seconds:7.2f} s", flush=True)
    return seconds


def naive(store: Store, manifest: Manifest, out: Path) -> None:
    for f in manifest.files:
        target = out / f.path
        target.parent.mkdir(parents=True, exist_ok=True)
        store.fs.get_file(store.object_path(f.sha256), str(target))


def gcsfs_get(store: Store, out: Path) -> None:
    store.fs.get(f"{store.root}/objects/", str(out) + "/", recursive=True)


def raw_read(store: Store, manifest: Manifest, workers: int, chunk: int) -> int:
    """Every byte once, in the same ranges and with the same concurrency as aotc; nothing kept."""
    fs = store.fs
    ranges = [(store.object_path(f.sha256), off, min(chunk, f.size - off))
              for f in sorted(manifest.files, key=lambda f: -f.size) for off in range(0, f.size, chunk)]

    async def run() -> int:
        gate = asyncio.Semaphore(workers)

        async def one(path: str, off: int, n: int) -> int:
            async with gate:
                data = await fs._cat_file(path, start=off, end=off + n)
                return len(data)

        return sum(await asyncio.gather(*(one(*r) for r in ranges)))

    from fsspec.asyn import sync

    return sync(fs.loop, run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=float, default=1.0, help="scale every file size (default 1.0)")
    parser.add_argument("--latency", type=float, default=0.03, help="seconds the proxy adds per request")
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS)
    parser.add_argument("--chunk-mb", type=int, default=CHUNK_SIZE // MB)
    parser.add_argument("--repeat", type=int, default=1, help="runs of (b), (c), (d); the best counts")
    parser.add_argument("--tmp", default=None, help="scratch dir (default: the system temp dir)")
    args = parser.parse_args()
    chunk = args.chunk_mb * MB

    scratch = Path(tempfile.mkdtemp(prefix="aotc-bench-", dir=args.tmp))
    server = FakeGcs().start()
    proxy, proxy_url = start_proxy(server.url, args.latency)
    try:
        server.make_bucket("bench")
        url = "gs://bench/store"
        files = synthetic_files(args.size)
        art = make_artifact(scratch, entry="bench--len2048-tp1", files=files)
        del files
        manifest = Manifest.load(art)
        total = manifest.total_size
        print(f"artifact: {len(manifest.files)} files, {total / 1e9:.2f} GB; proxy latency "
              f"{args.latency * 1000:.0f} ms; workers {args.workers}, chunk {args.chunk_mb} MiB", flush=True)
        publish_artifacts([str(art)], url, store=Store.from_url(url, endpoint_url=server.url, token="anon"))
        shutil.rmtree(art)

        def through_proxy() -> Store:
            return Store.from_url(url, endpoint_url=proxy_url, token="anon")

        def fresh(name: str) -> Path:
            path = scratch / name
            shutil.rmtree(path, ignore_errors=True)
            return path

        results: dict[str, list[float]] = {k: [] for k in "abcd"}
        results["a"].append(timed("(a) naive sequential get_file",
                                  lambda: naive(through_proxy(), manifest, fresh("a"))))
        shutil.rmtree(scratch / "a")
        for _ in range(args.repeat):  # interleaved, so a burst of load elsewhere hits all of them
            results["b"].append(timed("(b) gcsfs get(recursive=True)",
                                      lambda: gcsfs_get(through_proxy(), fresh("b"))))
            shutil.rmtree(scratch / "b")
            results["c"].append(timed("(c) raw parallel read, no write", lambda: raw_read(
                through_proxy(), manifest, args.workers, chunk)))
            results["d"].append(timed("(d) aotc fetch (sha256 + atomic)", lambda: fetch_artifact(
                url, str(fresh("d")), fingerprint=manifest.fingerprint, workers=args.workers, chunk_size=chunk,
                store=through_proxy())))
        cache = NodeCache(str(scratch / "node-cache"))
        cold_cached = timed("(e) aotc fetch, node cache cold", lambda: fetch_artifact(
            url, str(fresh("e1")), fingerprint=manifest.fingerprint, store=through_proxy(), cache=cache))
        warm = []
        warm_seconds = timed("(e) aotc fetch, node cache warm", lambda: warm.append(fetch_artifact(
            url, str(fresh("e2")), fingerprint=manifest.fingerprint, store=through_proxy(), cache=cache)))
        a, b, c, d = (min(results[k]) for k in "abcd")
        if args.repeat > 1:
            print(f"best of {args.repeat}: (b) {b:.2f} s, (c) {c:.2f} s, (d) {d:.2f} s")
        print(f"aotc fetch: {total / d / 1e6:.0f} MB/s; {a / d:.1f}x naive (goal >= 5x); "
              f"{b / d:.2f}x gcsfs get (goal > 1x); {c / d:.2f}x the raw read rate (goal >= 0.9x)")
        print(f"node cache: warm fetch {warm_seconds:.2f} s = {warm_seconds / cold_cached:.1%} of the cold one "
              f"({cold_cached:.2f} s; goal <= 5%), {warm[0].downloaded_size} object bytes downloaded, "
              f"{warm[0].cached_objects}/{warm[0].objects} objects from the cache")
    finally:
        proxy.terminate()
        proxy.wait()
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
