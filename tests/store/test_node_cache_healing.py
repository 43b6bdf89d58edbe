"""A node cache whose objects changed, whose layout is damaged, that is read-only or full: every fetch still
places the artifact's exact bytes, and the next fetch finds the cache healed.

Real ``aotc fetch`` processes against a local-folder store. The read-only and full caches are real tmpfs
mounts (root only; skipped with the reason otherwise).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from aotc.files import sha256_file
from aotc.manifest import Manifest
from aotc.testing.artifacts import expected_dest, make_artifact, random_files, tree
from tests.conftest import run_aotc

QUIET = {"AOTC_NO_PROGRESS": "1"}


def fetch(url: str, art: Path, dest: Path, cache: Path, *extra: str) -> tuple[dict, list[str]]:
    """(--json result, stderr lines) of a fetch that must succeed with the artifact's exact bytes."""
    proc = run_aotc("fetch", "--fingerprint", Manifest.load(art).fingerprint, "--dest", dest, "--store", url,
                    "--cache-dir", cache, "--json", *extra, env=QUIET)
    assert proc.returncode == 0, proc.stderr
    assert tree(dest) == expected_dest(art)
    return json.loads(proc.stdout), proc.stderr.strip().splitlines()


@pytest.fixture
def warm(local_url, artifacts, tmp_path):
    """(url, artifact, cache, the victim's FileRecord): a cache one fetch filled."""
    art = artifacts(files=random_files(5, seed=3, low=20_000, high=60_000))
    assert run_aotc("publish", art, "--store", local_url).returncode == 0
    cache = tmp_path / "cache"
    fetch(local_url, art, tmp_path / "pod0", cache)
    return local_url, art, cache, Manifest.load(art).files[0]


def cached(cache: Path, sha: str) -> Path:
    return cache / "objects" / sha[:2] / sha


def assert_healed(url: str, art: Path, cache: Path, dest: Path) -> None:
    """The next fetch downloads nothing and every cached object holds its own bytes."""
    doc, _ = fetch(url, art, dest, cache)
    assert doc["downloaded_size"] == 0, doc
    for f in Manifest.load(art).files:
        assert sha256_file(str(cached(cache, f.sha256)))[0] == f.sha256


# --- changed bytes -------------------------------------------------------------------------------------


def flip_a_byte_and_restore_the_mtime(path: Path, size: int) -> None:
    st = path.stat()
    path.chmod(0o644)
    with open(path, "r+b") as f:
        f.seek(size // 2)
        byte = f.read(1)
        f.seek(size // 2)
        f.write(bytes([byte[0] ^ 1]))
    path.chmod(st.st_mode)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def replace_with_the_same_size(path: Path, size: int) -> None:
    st = path.stat()
    other = path.with_name("impostor")
    other.write_bytes(b"\0" * size)
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    other.chmod(st.st_mode)
    os.replace(other, path)


def write_through_a_hard_link(path: Path, size: int) -> None:
    """A hard link to the cached object (what a dest is) written by whoever holds it."""
    st = path.stat()
    link = path.parent.parent.parent / "a-pods-dest-file"
    os.link(path, link)
    with open(link, "r+b") as f:  # root ignores the read-only mode, as a pod running as root would
        f.write(b"X" * size)
    os.utime(link, ns=(st.st_atime_ns, st.st_mtime_ns))
    link.unlink()


@pytest.mark.parametrize("change", [flip_a_byte_and_restore_the_mtime, replace_with_the_same_size,
                                    write_through_a_hard_link], ids=lambda f: f.__name__)
def test_a_changed_object_is_never_served_and_the_cache_heals(warm, tmp_path, change):
    url, art, cache, victim = warm
    change(cached(cache, victim.sha256), victim.size)
    doc, _ = fetch(url, art, tmp_path / "pod1", cache)
    assert doc["downloaded_size"] == victim.size  # that object, and only it, came from the store again
    assert_healed(url, art, cache, tmp_path / "pod2")


def test_what_a_pod_wrote_into_its_dest_is_never_served_to_the_next(warm, tmp_path):
    url, art, cache, victim = warm
    in_pod = tmp_path / "pod0" / victim.path
    in_pod.chmod(0o644)
    in_pod.write_bytes(b"X" * victim.size)  # dests share the cache's inodes: this writes the cached object
    doc, _ = fetch(url, art, tmp_path / "pod1", cache)
    assert doc["downloaded_size"] == victim.size
    assert_healed(url, art, cache, tmp_path / "pod2")


# --- damaged layout --------------------------------------------------------------------------------------


def replace_by_dir(path: Path) -> None:
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    (path / "junk").mkdir(parents=True)


def replace_by_file(path: Path) -> None:
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    path.write_text("junk")


DAMAGE = {
    "object_is_a_dir": lambda cache, sha, m: replace_by_dir(cached(cache, sha)),
    "shard_is_a_file": lambda cache, sha, m: replace_by_file(cached(cache, sha).parent),
    "objects_is_a_file": lambda cache, sha, m: replace_by_file(cache / "objects"),
    "tmp_is_a_file": lambda cache, sha, m: replace_by_file(cache / "tmp"),
    "lock_is_a_dir": lambda cache, sha, m: replace_by_dir(cache / "locks" / sha),
    "locks_is_a_file": lambda cache, sha, m: replace_by_file(cache / "locks"),
    "manifest_is_a_dir": lambda cache, sha, m: replace_by_dir(cache / "manifests" / m.entry / f"{m.fingerprint}.json"),
    "manifests_entry_is_a_file": lambda cache, sha, m: replace_by_file(cache / "manifests" / m.entry),
    "object_is_a_symlink": lambda cache, sha, m: (cached(cache, sha).unlink(),
                                                  cached(cache, sha).symlink_to("/etc/hostname")),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_cache_heals(warm, tmp_path, damage):
    url, art, cache, victim = warm
    DAMAGE[damage](cache, victim.sha256, Manifest.load(art))
    fetch(url, art, tmp_path / "pod1", cache)
    assert_healed(url, art, cache, tmp_path / "pod2")


# --- read-only and full --------------------------------------------------------------------------------


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                          text=True)
    if proc.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_warm_cache_on_a_read_only_mount_still_fetches(warm, tmp_path):
    url, art, _, _ = warm
    with tmpfs(tmp_path / "ro", "16m") as cache:
        fetch(url, art, tmp_path / "pod1", cache)
        subprocess.run(["mount", "-o", "remount,ro", str(cache)], check=True)
        _, lines = fetch(url, art, tmp_path / "pod2", cache)
        assert len(lines) <= 1 and all("node cache" in line and "Read-only" in line for line in lines), lines


def test_a_full_cache_filesystem_falls_back_to_the_store(local_url, artifacts, tmp_path):
    art = artifacts(files=random_files(6, seed=4, low=400_000, high=500_000))  # ~2.7 MB into 1 MB
    assert run_aotc("publish", art, "--store", local_url).returncode == 0
    with tmpfs(tmp_path / "full", "1m") as cache:
        doc, lines = fetch(local_url, art, tmp_path / "pod1", cache)
        assert len(lines) == 1 and "No space left" in lines[0], lines
        assert doc["downloaded_size"] == Manifest.load(art).total_size
        fetch(local_url, art, tmp_path / "pod2", cache)  # and again, with what fitted cached


def test_eviction_makes_room_before_an_insert(local_url, tmp_path):
    arts = [make_artifact(tmp_path / "art", entry=f"e{i}--x", files=random_files(3, seed=20 + i, low=200_000,
                                                                                 high=220_000))
            for i in range(2)]
    assert run_aotc("publish", *arts, "--store", local_url).returncode == 0
    with tmpfs(tmp_path / "small", "1m") as cache:  # room for one artifact, not two
        fetch(local_url, arts[0], tmp_path / "pod0", cache, "--cache-max-size", "900K")
        _, lines = fetch(local_url, arts[1], tmp_path / "pod1", cache, "--cache-max-size", "900K")
        assert lines == []  # room was made first: nothing failed for want of space
        doc, _ = fetch(local_url, arts[1], tmp_path / "pod2", cache, "--cache-max-size", "900K")
        assert doc["downloaded_size"] == 0
