"""Pods sharing one node cache: concurrent fetchers never fail for each other's clean-up, never wait
forever for each other's locks, and go around a holder that is stopped or silent.

Every fetcher here is a real ``aotc fetch`` process; the store is a local folder or the loopback fake GCS
server behind the fault proxy (latency or stalls, so a fetcher holds its locks while we act).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path


from aotc.manifest import Manifest
from aotc.testing.artifacts import expected_dest, make_artifact, random_files, tree
from aotc.testing.fetchers import concurrent_fetches, overlapping_files
from tests.conftest import REPO, run_aotc
from tests.store.conftest import wait_for

QUIET = {"AOTC_NO_PROGRESS": "1"}


def start_fetch(url: str, art: Path, dest: Path, cache: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "aotc.cli", "fetch", "--fingerprint", Manifest.load(art).fingerprint,
                             "--dest", str(dest), "--store", url, "--cache-dir", str(cache), *extra], cwd=REPO,
                            env={**os.environ, **QUIET}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def held_locks(cache: Path) -> list[str]:
    """Objects whose node-cache lock some process holds right now."""
    held = []
    for lock in (cache / "locks").glob("*"):
        with open(lock, "rb") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held.append(lock.name)
    return held


def locks_held_by(holder: subprocess.Popen, cache: Path) -> list[str]:
    """The locks held now, once the holder took some; a holder that already exited fails the test."""
    assert holder.poll() is None, f"the holder exited {holder.returncode}: {holder.stderr.read()}"
    return held_locks(cache)


def stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(10)


def test_concurrent_fetchers_sharing_a_node_cache_all_succeed(local_url, tmp_path):
    """The quick variant of bench/bench_node_cache_sharing.py (8 and 32 fetchers, 20 rounds)."""
    arts = [make_artifact(tmp_path / "art", entry=f"e{i}--x", files=files)
            for i, files in enumerate(overlapping_files(3))]
    assert run_aotc("publish", *arts, "--store", local_url).returncode == 0
    cache = tmp_path / "cache"
    for round_ in range(2):  # an empty cache (every object inserted while others wait), then a warm one
        result = concurrent_fetches(local_url, arts, cache, tmp_path / f"round{round_}", 8, 240,
                                    "--cache-max-size", "2M")
        assert result.ok, result


def test_a_stopped_lock_holder_is_gone_around(slow_store, proxy, tmp_path):
    url, local, art = slow_store
    cache = tmp_path / "cache"
    proxy.latency = 2.0  # the first fetcher holds its locks for a while
    holder = start_fetch(url, art, tmp_path / "pod1", cache)
    try:
        wait_for(lambda: locks_held_by(holder, cache), "the first fetcher to hold a lock", timeout=180)
        holder.send_signal(signal.SIGSTOP)  # a pod frozen mid-download (cgroup freezer, debugger, ...)
        proc = run_aotc("fetch", "--fingerprint", Manifest.load(art).fingerprint, "--dest", tmp_path / "pod2",
                        "--store", local, "--cache-dir", cache, env=QUIET, timeout=120)
        assert proc.returncode == 0, proc.stderr
        [line] = proc.stderr.strip().splitlines()
        assert "stopped" in line and f"pid {holder.pid}" in line, line
        assert tree(tmp_path / "pod2") == expected_dest(art)
    finally:
        stop(holder)


def test_a_fetch_that_fails_while_waiting_for_a_lock_exits_and_releases(slow_store, proxy, tmp_path):
    url, local, art = slow_store
    shared = Manifest.load(art).files
    other = make_artifact(tmp_path / "art", entry="other--x",
                          files={f.path: (art / "cache" / f.path).read_bytes() for f in shared}
                          | {"tp1_rank9/own": os.urandom(4096)})
    assert run_aotc("publish", other, "--store", local).returncode == 0
    own = next(f for f in Manifest.load(other).files if f.path == "tp1_rank9/own")
    shutil.rmtree(Path(local) / "objects" / "sha256" / own.sha256[:2])  # this fetch fails on that object
    cache = tmp_path / "cache"
    proxy.add("stall", match="objects", times=10_000)  # the holder waits on the store, alive, forever
    holder = start_fetch(url, art, tmp_path / "pod1", cache)
    try:
        wait_for(lambda: len(locks_held_by(holder, cache)) == len({f.sha256 for f in shared}), "every lock held",
                 timeout=180)
        started = time.monotonic()
        proc = run_aotc("fetch", "--fingerprint", Manifest.load(other).fingerprint, "--dest", tmp_path / "pod2",
                        "--store", local, "--cache-dir", cache, env=QUIET, timeout=120)
        assert proc.returncode == 3 and "missing from the store" in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        print(f"failed fetch queued on held locks exited after {time.monotonic() - started:.1f} s")
        assert set(held_locks(cache)) == {f.sha256 for f in shared}  # only the stalled holder's
    finally:
        stop(holder)
    assert held_locks(cache) == []


def test_a_silent_lock_holder_is_gone_around_within_the_deadline(slow_store, proxy, tmp_path):
    url, local, art = slow_store
    cache = tmp_path / "cache"
    proxy.add("stall", match="objects", times=10_000)
    holder = start_fetch(url, art, tmp_path / "pod1", cache)
    try:
        wait_for(lambda: locks_held_by(holder, cache), "the first fetcher to hold a lock", timeout=180)
        proc = run_aotc("fetch", "--fingerprint", Manifest.load(art).fingerprint, "--dest", tmp_path / "pod2",
                        "--store", local, "--cache-dir", cache, "--deadline", "20", env=QUIET, timeout=120)
        assert proc.returncode == 0, proc.stderr
        [line] = proc.stderr.strip().splitlines()
        assert "no progress" in line, line
        assert tree(tmp_path / "pod2") == expected_dest(art)
    finally:
        stop(holder)


def test_clean_up_never_removes_a_live_fetchers_download(slow_store, proxy, tmp_path):
    url, local, art = slow_store
    cache = tmp_path / "cache"
    proxy.latency = 2.0
    holder = start_fetch(url, art, tmp_path / "pod1", cache)
    try:
        downloads = wait_for(lambda: [p for p in (cache / "tmp").rglob("*") if p.is_file()], "a download in tmp/")
        for path in [*downloads, *(cache / "tmp").rglob("*")]:  # looks abandoned for a day
            os.utime(path, (time.time() - 86400,) * 2)
        other = make_artifact(tmp_path / "art", entry="tiny--x", files=random_files(1, seed=99))
        assert run_aotc("publish", other, "--store", local).returncode == 0
        proc = run_aotc("fetch", "--fingerprint", Manifest.load(other).fingerprint, "--dest", tmp_path / "pod2",
                        "--store", local, "--cache-dir", cache, env=QUIET)  # its clean-up runs meanwhile
        assert proc.returncode == 0, proc.stderr
        assert holder.wait(120) == 0, holder.stderr.read()
        assert tree(tmp_path / "pod1") == expected_dest(art)
    finally:
        stop(holder)
