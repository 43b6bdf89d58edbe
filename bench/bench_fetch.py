"""Fetch benchmark on loopback: aotc fetch against three baselines, through a proxy adding latency.

    python bench/bench_fetch.py              # ~300 files / 1.1 GB (five of 150 MB, the rest 0.1-2 MB)
    python bench/bench_fetch.py --size 0.1   # every file a tenth as large, for a quick run
    python bench/bench_fetch.py --only node-cache --repeat 5   # (e) alone, five cold/warm pairs

A fake-gcs-server (memory backend) sits behind aotc/testing/faultproxy.py (its own process, ``--latency``
seconds added to every request). The artifact is published straight to the server; every measurement
reads through the proxy. (b)-(d0) run interleaved ``--repeat`` times; each timed run reports its wall time
and CPU seconds (this process, and the harness: server + proxy, which share this machine's cores):

  (a) naive      a sequential loop of gcsfs ``get_file``, one object at a time
  (b) gcsfs get  gcsfs' own ``get(recursive=True)`` of the objects (parallel, no verification)
  (c) raw read   the same objects read in parallel ranges, nothing written or hashed (the ceiling)
  (d) aotc       ``fetch_artifact``: parallel ranged reads, sha256 while streaming, atomic placement
  (d0)           the same with sha256 replaced by a no-op inside this process (a measurement of what
                 verifying costs; aotc itself has no such switch)
  (e) node cache ``fetch_artifact`` with a node cache: cold (download + insert into an empty cache), then
                 warm into a second dest (a second pod on the node: nothing downloaded, objects hard-linked
                 and each hashed where it was linked); with --repeat N and --only node-cache, N such
                 pairs, each on a fresh cache
"""

from __future__ import annotations

import os

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import argparse
import asyncio
import hashlib
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from aotc.fetch import FetchOptions, fetch_artifact  # noqa: E402
from aotc.fetch_download import CHUNK_SIZE, DEFAULT_WORKERS  # noqa: E402
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


class LoopbackGcs:
    """The fake GCS server and, in its own process, the latency proxy in front of it."""

    def __init__(self, latency: float):
        self.server = FakeGcs().start()
        try:
            self.proxy, self.proxy_url = start_proxy(self.server.url, latency)
        except BaseException:
            self.server.stop()
            raise
        self.pids = [self.server._proc.pid, self.proxy.pid]  # whose CPU counts as the harness's

    def stop(self) -> None:
        self.proxy.terminate()
        self.proxy.wait()
        self.server.stop()


@dataclass
class Run:
    wall: float
    client_cpu: float  # this process: requests, hashing, writing
    harness_cpu: float  # the fake GCS server and the latency proxy (a real store's CPU is elsewhere)

    @property
    def cpu_floor(self) -> float:
        """The wall this run could not beat on this machine's cores: all its CPU spread perfectly."""
        return (self.client_cpu + self.harness_cpu) / (os.cpu_count() or 1)


def process_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def warm_memory(size: int, where: Path) -> None:
    """Write and delete a ``size``-byte file in ``where`` so every contender writes into memory the host backs.

    Measured on this project's VMs (Firecracker, free-page reporting + DAMON): memory idle for a few seconds
    goes back to the host, and writing 1.1 GB of new page cache into it costs 1.2-3 s of CPU instead of
    ~0.3 s; page cache freed just before is reused at the low cost (touching anonymous memory instead
    helped only partly). A TPU host keeps its memory; without this, each run pays a different toll.
    """
    block = bytes(16 * MB)
    path = where / ".warm-memory"
    with open(path, "wb") as f:
        for _ in range(max(1, size // len(block))):
            f.write(block)
    path.unlink()


def timed(label: str, fn, harness: list[int], prepare=None) -> Run:
    if prepare is not None:
        prepare()
    before = resource.getrusage(resource.RUSAGE_SELF)
    harness_before = sum(process_cpu(pid) for pid in harness)
    started = time.perf_counter()
    fn()
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    run = Run(wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
              sum(process_cpu(pid) for pid in harness) - harness_before)
    print(f"  {label:<44} {wall:6.2f} s   CPU: client {run.client_cpu:5.2f} s, harness {run.harness_cpu:5.2f} s "
          f"(floor {run.cpu_floor:5.2f} s)", flush=True)
    return run


@contextmanager
def sha256_switched_off():
    """Measurement only, never in aotc: what verifying costs, by the same fetch with a no-op digest."""
    import aotc.fetch_download as fetch_module

    class AnyDigest(str):
        def __ne__(self, other: object) -> bool:
            return False

    class NoDigest:
        def update(self, data: bytes) -> None:
            pass

        def hexdigest(self) -> str:
            return AnyDigest()

    real = fetch_module.hashlib
    fetch_module.hashlib = SimpleNamespace(sha256=lambda *args: NoDigest())
    try:
        yield
    finally:
        fetch_module.hashlib = real


def sha256_cpu(size: int) -> float:
    """CPU seconds to sha256 ``size`` bytes on one core here (OpenSSL, SHA extensions when present)."""
    block = os.urandom(16 * MB)
    hasher, started = hashlib.sha256(), time.process_time()
    for _ in range(max(1, size // len(block))):
        hasher.update(block)
    return time.process_time() - started


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


def node_cache_pair(scratch: Path, aotc_fetch: Any, fresh: Any, harness: list[int], prepare: Any
                    ) -> tuple[float, float, list[Any]]:
    """(cold seconds, warm seconds, [the warm FetchResult]) on a fresh node cache."""
    shutil.rmtree(scratch / "node-cache", ignore_errors=True)
    cache = NodeCache(str(scratch / "node-cache"))
    dest = fresh("e1")
    cold = timed("(e) aotc fetch, node cache cold", lambda: aotc_fetch(dest, cache), harness, prepare).wall
    warm: list[Any] = []
    dest = fresh("e2")
    warm_seconds = timed("(e) aotc fetch, node cache warm", lambda: warm.append(aotc_fetch(dest, cache)),
                         harness, prepare).wall
    fresh("e1"), fresh("e2")  # pods gone: their links' removal moves each object's ctime, so all are hashed
    dest = fresh("e3")
    timed("(e) aotc fetch, node cache warm, seals broken", lambda: aotc_fetch(dest, cache), harness, prepare)
    return cold, warm_seconds, warm


def node_cache_pairs(repeat: int, scratch: Path, aotc_fetch: Any, fresh: Any, harness: list[int], prepare: Any
                     ) -> None:
    ratios = []
    for _ in range(repeat):
        cold, warm, _ = node_cache_pair(scratch, aotc_fetch, fresh, harness, prepare)
        ratios.append(warm / cold)
    print(f"node cache: warm fetch / cold fetch over {repeat} pairs: median {statistics.median(ratios):.1%}, "
          f"range {min(ratios):.1%}-{max(ratios):.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=float, default=1.0, help="scale every file size (default 1.0)")
    parser.add_argument("--latency", type=float, default=0.03, help="seconds the proxy adds per request")
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS)
    parser.add_argument("--chunk-mb", type=int, default=CHUNK_SIZE // MB)
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds of (b)-(d); best and median shown")
    parser.add_argument("--memory", choices=("warm", "as-is"), default="warm",
                        help="warm: write and delete a file before each timed run (see warm_memory); as-is: don't")
    parser.add_argument("--tmp", default=None, help="scratch dir (default: the system temp dir)")
    parser.add_argument("--only", choices=("node-cache",), default=None,
                        help="node-cache: only (e), --repeat cold/warm pairs (the warm fetch as a share of the cold)")
    args = parser.parse_args()
    chunk = args.chunk_mb * MB

    scratch = Path(tempfile.mkdtemp(prefix="aotc-bench-", dir=args.tmp))
    gcs = LoopbackGcs(args.latency)
    server, proxy_url, harness = gcs.server, gcs.proxy_url, gcs.pids
    try:
        server.make_bucket("bench")
        url = "gs://bench/store"
        files = synthetic_files(args.size)
        art = make_artifact(scratch, entry="bench--len2048-tp1", files=files)
        del files
        manifest = Manifest.load(art)
        total = manifest.total_size
        prepare = (lambda: warm_memory(int(total * 1.5), scratch)) if args.memory == "warm" else None
        print(f"artifact: {len(manifest.files)} files, {total / 1e9:.2f} GB; proxy latency "
              f"{args.latency * 1000:.0f} ms; workers {args.workers}, chunk {args.chunk_mb} MiB; "
              f"{os.cpu_count()} cores; memory {args.memory}", flush=True)
        publish_artifacts([str(art)], url, store=Store.from_url(url, endpoint_url=server.url, token="anon"))
        shutil.rmtree(art)

        def through_proxy() -> Store:
            return Store.from_url(url, endpoint_url=proxy_url, token="anon")

        def fresh(name: str) -> str:
            path = scratch / name
            shutil.rmtree(path, ignore_errors=True)  # before the clock starts
            return str(path)

        def aotc_fetch(dest: str, cache: NodeCache | None = None) -> Any:
            return fetch_artifact(url, dest, fingerprint=manifest.fingerprint, store=through_proxy(),
                                  options=FetchOptions(workers=args.workers, chunk_size=chunk, cache=cache))

        def unverified(dest: str) -> None:
            with sha256_switched_off():
                aotc_fetch(dest)

        if args.only == "node-cache":
            node_cache_pairs(args.repeat, scratch, aotc_fetch, fresh, harness, prepare)
            return
        runs: dict[str, list[Run]] = {k: [] for k in ("a", "b", "c", "d", "d0")}
        dest = fresh("a")
        runs["a"].append(timed("(a) naive sequential get_file", lambda: naive(through_proxy(), manifest, Path(dest)),
                               harness, prepare))
        for _ in range(args.repeat):  # interleaved, so a burst of load elsewhere hits all of them
            dest = fresh("b")
            runs["b"].append(timed("(b) gcsfs get(recursive=True)", lambda: gcsfs_get(through_proxy(), Path(dest)),
                                   harness, prepare))
            runs["c"].append(timed("(c) raw parallel read, no write", lambda: raw_read(
                through_proxy(), manifest, args.workers, chunk), harness, prepare))
            dest = fresh("d")
            runs["d"].append(timed("(d) aotc fetch (sha256 + atomic)", lambda: aotc_fetch(dest), harness, prepare))
            dest = fresh("d0")
            runs["d0"].append(timed("(d0) aotc fetch, sha256 off (measurement)", lambda: unverified(dest), harness,
                                    prepare))
        cold_cached, warm_seconds, warm = node_cache_pair(scratch, aotc_fetch, fresh, harness, prepare)
        best = {k: min(r.wall for r in v) for k, v in runs.items() if v}
        median = {k: statistics.median(r.wall for r in v) for k, v in runs.items() if v}
        a, b, c, d, d0 = (best[k] for k in ("a", "b", "c", "d", "d0"))
        print(f"best of {args.repeat} (median): (b) {b:.2f} ({median['b']:.2f}) s, (c) {c:.2f} ({median['c']:.2f}) s, "
              f"(d) {d:.2f} ({median['d']:.2f}) s, (d0) {d0:.2f} ({median['d0']:.2f}) s")
        print(f"aotc fetch: {total / d / 1e6:.0f} MB/s; {a / d:.1f}x naive (goal >= 5x); "
              f"{b / d:.2f}x gcsfs get (goal > 1x); {c / d:.2f}x the raw read rate (goal >= 0.9x); "
              f"medians: {median['b'] / median['d']:.2f}x gcsfs, {median['c'] / median['d']:.2f}x raw")
        mean = {k: Run(*(statistics.fmean(getattr(r, f) for r in v) for f in ("wall", "client_cpu", "harness_cpu")))
                for k, v in runs.items() if v}
        print(f"without sha256 (d0): {c / d0:.2f}x the raw read rate: writing, placing and the rest of fetch cost "
              f"{mean['d0'].client_cpu - mean['c'].client_cpu:+.2f} CPU-s over the raw read; sha256 "
              f"{mean['d'].client_cpu - mean['d0'].client_cpu:+.2f} CPU-s (one core hashes {total / 1e9:.2f} GB in "
              f"{sha256_cpu(total):.2f} s here)")
        print(f"CPU floor (all CPU of a run spread over {os.cpu_count()} cores, mean): "
              f"(c) {mean['c'].cpu_floor:.2f} s, (d) {mean['d'].cpu_floor:.2f} s; the harness (fake GCS + proxy) takes "
              f"{mean['d'].harness_cpu:.2f} of (d)'s {mean['d'].client_cpu + mean['d'].harness_cpu:.2f} CPU-s")
        print(f"node cache: warm fetch {warm_seconds:.2f} s = {warm_seconds / cold_cached:.1%} of the cold one "
              f"({cold_cached:.2f} s; goal <= 5%), {warm[0].downloaded_size} object bytes downloaded, "
              f"{warm[0].cached_objects}/{warm[0].objects} objects from the cache")
    finally:
        gcs.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
