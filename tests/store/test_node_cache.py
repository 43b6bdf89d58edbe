"""fetch --cache-dir: one download per node, verified on insert, linked into dest, LRU-bounded, never
serving a changed object; and fetch --deadline: a stalled store cannot hold a pod."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aotc.manifest import Manifest
from aotc.store import ENV_STORE_ENDPOINT
from tests.conftest import CONFIGS, REPO, run_aotc
from aotc.testing.artifacts import expected_dest, random_files, tree
from tests.store.conftest import new_bucket

QUIET = {"AOTC_NO_PROGRESS": "1"}


def fetch(url: str, art: Path, dest: Path, cache: Path, *extra: str, env: dict | None = None) -> dict:
    proc = run_aotc("fetch", "--fingerprint", Manifest.load(art).fingerprint, "--dest", dest, "--store", url,
                    "--cache-dir", cache, "--json", *extra, env={**QUIET, **(env or {})})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def sizes(art: Path) -> dict[str, int]:
    return {f.sha256: f.size for f in Manifest.load(art).files}


def test_second_fetch_downloads_nothing_and_links(gcs_url, artifacts, tmp_path):
    art = artifacts(files=random_files(8, seed=1) | {"tp1_rank0/big": os.urandom(3 << 20)})
    assert run_aotc("publish", art, "--store", gcs_url).returncode == 0
    cache = tmp_path / "node-cache"
    cold = fetch(gcs_url, art, tmp_path / "pod1", cache)
    assert cold["downloaded_size"] == sum(sizes(art).values()) and cold["cached_objects"] == 0
    warm = fetch(gcs_url, art, tmp_path / "pod2", cache)
    assert warm["downloaded_size"] == 0 and warm["cached_objects"] == cold["objects"]
    assert tree(tmp_path / "pod1") == tree(tmp_path / "pod2") == expected_dest(art)
    big = tmp_path / "pod2" / "tp1_rank0" / "big"
    assert big.stat().st_nlink >= 3  # cache + two pods: one copy on the node's disk
    # a fully warm node does not need the store at all (its manifest paths are written once)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    offline = fetch(gcs_url, art, tmp_path / "pod3", cache, env={ENV_STORE_ENDPOINT: closed})
    assert offline["downloaded_size"] == 0 and tree(tmp_path / "pod3") == expected_dest(art)


def test_an_overlapping_entry_downloads_only_what_it_does_not_share(local_url, artifacts, tmp_path):
    shared = random_files(5, seed=2)
    first = artifacts(entry="a--x", files=shared | random_files(2, seed=3))
    second = artifacts(entry="b--x", files=shared | random_files(3, seed=4))
    assert run_aotc("publish", first, second, "--store", local_url).returncode == 0
    cache = tmp_path / "cache"
    fetch(local_url, first, tmp_path / "a", cache)
    doc = fetch(local_url, second, tmp_path / "b", cache)
    own = {sha: n for sha, n in sizes(second).items() if sha not in sizes(first)}
    assert doc["downloaded_size"] == sum(own.values()) and doc["cached_objects"] == 5
    assert tree(tmp_path / "b") == expected_dest(second)


def test_a_cached_object_changed_through_a_pods_link_is_never_served(local_url, artifacts, tmp_path):
    art = artifacts()
    assert run_aotc("publish", art, "--store", local_url).returncode == 0
    cache = tmp_path / "cache"
    fetch(local_url, art, tmp_path / "pod1", cache)
    victim = Manifest.load(art).files[0]
    in_pod = tmp_path / "pod1" / victim.path
    in_pod.chmod(0o644)
    in_pod.write_bytes(b"X" * victim.size)  # same size, through the hard link the cache shares
    doc = fetch(local_url, art, tmp_path / "pod2", cache)
    assert doc["downloaded_size"] == victim.size and tree(tmp_path / "pod2") == expected_dest(art)


def test_two_fetchers_on_one_node_download_each_object_once(gcs_server, proxy, artifacts, tmp_path):
    url = f"gs://{new_bucket(gcs_server)}/store"
    art = artifacts(files=random_files(12, seed=5, low=64 << 10, high=512 << 10))
    assert run_aotc("publish", art, "--store", url).returncode == 0
    proxy.latency = 0.02  # both are mid-download at once
    cache = tmp_path / "cache"
    procs = [subprocess.Popen([sys.executable, "-m", "aotc.cli", "fetch", "--fingerprint",
                               Manifest.load(art).fingerprint, "--dest", str(tmp_path / f"pod{i}"), "--store",
                               url, "--cache-dir", str(cache), "--json"], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, **QUIET})
             for i in range(2)]
    docs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        docs.append(json.loads(out))
    assert sum(d["downloaded_size"] for d in docs) == sum(sizes(art).values())
    assert tree(tmp_path / "pod0") == tree(tmp_path / "pod1") == expected_dest(art)


def test_the_cache_keeps_to_its_size_bound_least_recently_used_first(local_url, artifacts, tmp_path):
    arts = [artifacts(entry=f"e{i}--x", files=random_files(3, seed=10 + i, low=100_000, high=100_000))
            for i in range(3)]
    assert run_aotc("publish", *arts, "--store", local_url).returncode == 0
    cache = tmp_path / "cache"
    for i, art in enumerate(arts):
        fetch(local_url, art, tmp_path / f"pod{i}", cache, "--cache-max-size", "650K")
    cached = {p.name for p in (cache / "objects").rglob("*") if p.is_file()}
    assert set(sizes(arts[2])) <= cached and not set(sizes(arts[0])) & cached  # the oldest went first
    assert sum(sizes(a)[s] for a in arts for s in sizes(a) if s in cached) <= 650 << 10


def test_a_cache_dir_that_is_a_file_is_bad_input(local_url, artifacts, tmp_path):
    (tmp_path / "file").write_text("x")
    proc = run_aotc("fetch", "--fingerprint", "a" * 64, "--dest", tmp_path / "d", "--store", local_url,
                    "--cache-dir", tmp_path / "file")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# --- fetch --deadline ------------------------------------------------------------------------------

DEMO = CONFIGS / "demo.yaml"
DEMO_ENTRY = "tiny-llama--len128-seqs8-tok64-tp1"


@pytest.mark.parametrize("require, code", [("", 0), ("1", 3)], ids=["optional", "required"])
def test_a_stalled_store_cannot_hold_a_pod(gcs_server, proxy, tmp_path, require, code):
    url = f"gs://{new_bucket(gcs_server)}/store"
    proxy.add("stall", times=10_000)  # every request hangs: the store accepted the connection and went quiet
    started = time.monotonic()
    proc = run_aotc("fetch", "--config", DEMO, "--entry", DEMO_ENTRY, "--dest", tmp_path / "dest", "--store", url,
                    "--optional", "--deadline", "5", env={**QUIET, "AOTC_REQUIRE": require}, timeout=60)
    elapsed = time.monotonic() - started
    assert proc.returncode == code, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert "deadline" in line and ("WITHOUT a compiled cache" in line) == (code == 0)
    assert not (tmp_path / "dest").exists()
    print(f"stalled store, --deadline 5, AOTC_REQUIRE={require!r}: exit {proc.returncode} after {elapsed:.1f}s")


def test_whoever_writes_the_node_cache_cannot_seal_altered_bytes(local_url, artifacts, tmp_path):
    """A seal lets fetch serve an object without reading it. Someone who can write the shared cache (not the
    fetcher's key, which lives outside it, in AOTC_HOME here) overwrites an object and writes its new stat
    into the lock file's seal: the next fetch hashes what it links, finds other bytes and fetches the object."""
    art = artifacts(files=random_files(3, seed=11) | {"tp1_rank0/big": os.urandom(1 << 20)})
    assert run_aotc("publish", art, "--store", local_url).returncode == 0
    env, cache = {"AOTC_HOME": str(tmp_path / "fetcher-home")}, tmp_path / "node-cache"
    fetch(local_url, art, tmp_path / "pod1", cache, env=env)
    big = next(f for f in Manifest.load(art).files if f.path == "tp1_rank0/big")
    cached, lock = cache / "objects" / big.sha256[:2] / big.sha256, cache / "locks" / big.sha256
    cached.write_bytes(os.urandom(big.size))  # root: the object's 0444 does not stop it
    st, record = cached.stat(), json.loads(lock.read_text())
    record["seal"] = [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_nlink]
    lock.write_text(json.dumps(record))
    second = fetch(local_url, art, tmp_path / "pod2", cache, env=env)
    assert tree(tmp_path / "pod2") == expected_dest(art)
    assert second["downloaded_size"] == big.size  # the altered object was fetched again


def test_a_seal_key_inside_the_node_cache_is_refused(local_url, artifacts, tmp_path):
    art = artifacts(files=random_files(2, seed=12))
    assert run_aotc("publish", art, "--store", local_url).returncode == 0
    cache = tmp_path / "node-cache"
    proc = run_aotc("fetch", "--fingerprint", Manifest.load(art).fingerprint, "--dest", tmp_path / "pod",
                    "--store", local_url, "--cache-dir", cache,
                    env={**QUIET, "AOTC_CACHE_KEY_FILE": str(cache / "key")})
    assert proc.returncode == 2 and "inside the node cache" in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "pod").exists()
