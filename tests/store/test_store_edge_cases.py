"""Store, publish and fetch edge cases, each through the real ``aotc`` command.

Stores are a local folder or the loopback
fake-gcs-server (through tests/helpers/faultproxy.py where the network has to misbehave).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from aotc.errors import DeadlineExceeded
from aotc.manifest import Manifest
from aotc.store import ENV_STORE_ENDPOINT, Store
from tests.conftest import REPO, run_aotc
from tests.helpers.cli import json_output, one_line_error
from aotc.testing.artifacts import expected_dest, make_artifact, random_files, tree
from tests.store.conftest import new_bucket, wait_for

QUIET = {"AOTC_NO_PROGRESS": "1"}


def aotc(*args, env=None, **kw) -> subprocess.CompletedProcess:
    return run_aotc(*args, env={**QUIET, **(env or {})}, **kw)


def ok(*args, env=None, **kw) -> dict:
    return json_output(aotc(*args, "--json", env=env, **kw))


one_line = one_line_error


def fp(art: Path) -> str:
    return Manifest.load(art).fingerprint


# 1 ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["", ".", "full"])
def test_1_fetch_never_deletes_a_users_directory(local_url, artifacts, tmp_path, spelling):
    art = artifacts()
    ok("publish", str(art), "--store", local_url)
    home = tmp_path / "home"
    (home / "notes").mkdir(parents=True)
    (home / "thesis.tex").write_text("years of work")
    (home / "notes" / "a").write_text("more")
    before = tree(home)
    dest = str(home) if spelling == "full" else spelling
    message = one_line(aotc("fetch", "--fingerprint", fp(art), "--dest", dest, "--store", local_url, cwd=home), 2)
    assert "--dest" in message or "not empty" in message
    assert tree(home) == before


def test_1_an_earlier_fetch_is_replaced(local_url, artifacts, tmp_path):
    old, new = artifacts(inputs={"v": 1}, files=random_files(3, seed=1)), artifacts(inputs={"v": 2})
    ok("publish", str(old), str(new), "--store", local_url)
    dest = tmp_path / "dest"
    ok("fetch", "--fingerprint", fp(old), "--dest", str(dest), "--store", local_url)
    ok("fetch", "--fingerprint", fp(new), "--dest", str(dest), "--store", local_url)
    assert tree(dest) == expected_dest(new)
    (dest / "stranger").write_text("not ours")
    one_line(aotc("fetch", "--fingerprint", fp(old), "--dest", str(dest), "--store", local_url), 2)
    assert (dest / "stranger").read_text() == "not ours"


# 2 ------------------------------------------------------------------------------------------------


def test_2_many_files_under_a_low_open_file_limit(local_url, tmp_path):
    files = random_files(1200, seed=2, low=1, high=64)
    art = make_artifact(tmp_path / "art", files=files)
    ok("publish", str(art), "--store", local_url)
    limit = 256  # far below the artifact's 1,200 files, far above what aotc needs itself

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    proc = subprocess.run([sys.executable, "-m", "aotc.cli", "fetch", "--fingerprint", fp(art), "--dest",
                           str(tmp_path / "dest"), "--store", local_url], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, **QUIET}, preexec_fn=low_limit, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert tree(tmp_path / "dest") == expected_dest(art)


# 3 ------------------------------------------------------------------------------------------------

MALFORMED = {
    "bad-utf8--x": b'{"schema": 1, "entry": "bad-utf8--x", "note": "\xff\xfe"}',
    "huge-number--x": b'{"schema": 1, "size": ' + b"9" * 5000 + b"}",
    "deep--x": b"[" * 100_000 + b"]" * 100_000,
}


def test_3_a_malformed_manifest_is_reported_and_skipped(local_url, artifacts, tmp_path):
    good = artifacts()
    ok("publish", str(good), "--store", local_url)
    store = Store.from_url(local_url)
    for entry, body in MALFORMED.items():
        store.replace(store.manifest_path(entry, "f" * 64), body)
    listing = aotc("ls", "--json", "--store", local_url)
    assert listing.returncode == 0 and "Traceback" not in listing.stderr, listing.stderr
    doc = json.loads(listing.stdout)
    assert [e["name"] for e in doc["entries"]] == [Manifest.load(good).entry]
    damaged = [w for w in doc["warnings"] if w["kind"] == "damaged_manifest"]
    assert len(damaged) == 3 and len(listing.stderr.strip().splitlines()) == 3
    gc = ok("gc", "--keep", "1", "--store", local_url)
    assert gc["report"]["deleted_objects"] == 0  # a damaged manifest might name any object
    dest = ["--dest", str(tmp_path / "d"), "--store", local_url]
    one_line(aotc("fetch", "--fingerprint", "f" * 64, *dest), 4)
    one_line(aotc("fetch", "--fingerprint", "f" * 64, "--optional", *dest, env={"AOTC_REQUIRE": ""}), 4)
    ok("fetch", "--fingerprint", fp(good), *dest)


# 4 ------------------------------------------------------------------------------------------------


def test_4_a_gcs_range_error_is_one_line(gcs_url, artifacts, tmp_path):
    art = artifacts(files={"tp1_rank0/big": os.urandom(17 << 20)})  # two 16 MiB ranges
    ok("publish", str(art), "--store", gcs_url)
    store = Store.from_url(gcs_url)
    [record] = Manifest.load(art).files
    store.replace(store.object_path(record.sha256), b"short")  # the second range now starts past the end
    message = one_line(aotc("fetch", "--fingerprint", fp(art), "--dest", str(tmp_path / "d"), "--store", gcs_url), 4)
    assert "truncated" in message


def test_4_an_unreachable_store_is_one_line(tmp_path):
    closed = f"http://127.0.0.1:{_closed_port()}"
    proc = aotc("fetch", "--fingerprint", "a" * 64, "--dest", str(tmp_path / "d"), "--store", "gs://b/s",
                "--deadline", "3", env={ENV_STORE_ENDPOINT: closed})
    one_line(proc, 3)


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# 5 ------------------------------------------------------------------------------------------------


def _peak_rss_mib(args: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    """Run the CLI in a child of a fresh python, which reports that child's peak RSS alone."""
    probe = ("import resource, subprocess, sys, json; "
             "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
             "print(json.dumps([p.returncode, p.stderr, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]))")
    out = subprocess.run([sys.executable, "-c", probe, sys.executable, "-m", "aotc.cli", *args], cwd=REPO,
                         capture_output=True, text=True, env={**os.environ, **QUIET}, timeout=120)
    code, stderr, rss_kib = json.loads(out.stdout)
    return subprocess.CompletedProcess(args, code, "", stderr), rss_kib / 1024


@pytest.fixture
def one_object_store(local_url, artifacts):
    art = artifacts(files={"tp1_rank0/obj": os.urandom(1 << 20)})
    ok("publish", str(art), "--store", local_url)
    [record] = Manifest.load(art).files
    return art, Path(Store.from_url(local_url).object_path(record.sha256))


def test_5_a_swapped_giant_object_is_refused_with_bounded_memory(local_url, one_object_store, tmp_path):
    art, obj = one_object_store
    obj.unlink()
    with open(obj, "wb") as f:  # sparse: 768 MiB on the page cache, nothing on disk
        f.truncate(768 << 20)
    proc, peak = _peak_rss_mib(["fetch", "--fingerprint", fp(art), "--dest", str(tmp_path / "d"),
                                "--store", local_url])
    assert "larger" in one_line(proc, 4)
    assert peak < 400, f"peak RSS {peak:.0f} MiB"


@pytest.mark.parametrize("kind", ["dev-zero-link", "fifo"])
def test_5_non_regular_files_in_a_local_store_are_refused(local_url, one_object_store, tmp_path, kind):
    art, obj = one_object_store
    obj.unlink()
    if kind == "fifo":
        os.mkfifo(obj)
    else:
        obj.symlink_to("/dev/zero")
    proc = aotc("fetch", "--fingerprint", fp(art), "--dest", str(tmp_path / "d"), "--store", local_url,
                timeout=60)
    assert "not a regular file" in one_line(proc, 4)


# 6 ------------------------------------------------------------------------------------------------

MANIFEST_GET = "/download/.*manifests%2F"


@pytest.fixture
def proxied_url(gcs_server, proxy) -> str:
    return f"gs://{new_bucket(gcs_server)}/store"


def test_6_a_manifest_changed_in_transit_is_caught(proxied_url, artifacts, proxy, tmp_path):
    from aotc.errors import IntegrityError
    from aotc.fetch import fetch_artifact
    from aotc.publish import publish_artifacts

    art = artifacts()
    publish_artifacts([str(art)], proxied_url)
    proxy.add("flip", MANIFEST_GET, times=1, arg='"path": "tp1_rank0/')  # still valid JSON, another path
    fetch_artifact(proxied_url, str(tmp_path / "d"), fingerprint=fp(art))
    assert proxy.injected["flip"] == 1
    assert tree(tmp_path / "d") == expected_dest(art)  # the re-read one, not the flipped one
    proxy.add("flip", MANIFEST_GET, times=100, arg='"path": "tp1_rank0/')
    with pytest.raises(IntegrityError, match="digest"):
        fetch_artifact(proxied_url, str(tmp_path / "e"), fingerprint=fp(art))
    assert not (tmp_path / "e").exists()


# 7 ------------------------------------------------------------------------------------------------


def test_7_a_killed_gc_lease_is_announced_and_can_be_broken(gcs_server, proxy, artifacts, tmp_path):
    url = f"gs://{new_bucket(gcs_server)}/store"
    env = {ENV_STORE_ENDPOINT: proxy.url, "AOTC_GC_MIN_AGE_SECONDS": "0", **QUIET}
    ok("publish", str(artifacts(inputs={"v": 1})), "--store", url, env=env)
    proxy.add("stall", method="DELETE", times=1000)  # gc holds its lease while the delete hangs
    gc = subprocess.Popen([sys.executable, "-m", "aotc.cli", "gc", "--keep", "0", "--store", url], cwd=REPO,
                          env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    store = Store.from_url(url, endpoint_url=gcs_server.url)
    _wait_for(lambda: store.find("locks"), "the gc lease")
    time.sleep(0.5)
    gc.send_signal(signal.SIGKILL)
    gc.wait(10)
    proxy.clear()
    publish = subprocess.Popen([sys.executable, "-m", "aotc.cli", "publish", str(artifacts(inputs={"v": 2})),
                                "--store", url], cwd=REPO, env={**os.environ, **env},
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        line = publish.stderr.readline()  # blocks until the first warning: the publish is waiting
        assert line.startswith("aotc: warning:") and "gc lease" in line and "age" in line, line
        assert "aotc break-lease" in line
        broken = aotc("break-lease", "--store", url, env=env)
        assert broken.returncode == 0 and "removed gc lease" in broken.stderr, broken.stderr
        assert publish.wait(60) == 0, publish.stderr.read()
    finally:
        publish.kill()
        publish.wait()


def _wait_for(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# 8 ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["local", "gcs"])
def test_8_republish_repairs_a_same_size_corrupted_object(request, artifacts, tmp_path, backend):
    url = request.getfixturevalue(f"{backend}_url")
    art = artifacts()
    ok("publish", str(art), "--store", url)
    store = Store.from_url(url)
    victim = Manifest.load(art).files[0]
    data = bytearray(store.read(store.object_path(victim.sha256)))
    data[0] ^= 0xFF
    store.replace(store.object_path(victim.sha256), bytes(data))
    dest = ["--dest", str(tmp_path / "d"), "--store", url]
    one_line(aotc("fetch", "--fingerprint", fp(art), *dest), 4)
    [result] = ok("publish", str(art), "--store", url)["published"]
    assert result["status"] == "already" and result["repaired_objects"] == 1
    ok("fetch", "--fingerprint", fp(art), *dest)
    assert tree(tmp_path / "d") == expected_dest(art)


# 9 ------------------------------------------------------------------------------------------------


def test_9_the_newest_of_concurrent_publishes_wins_the_ref(gcs_server, proxy, artifacts, tmp_path):
    from tests.store.test_crash_race import Zygote

    proxy.latency = 0.02  # a network's round trip, so read-then-write windows overlap as they do on GCS
    zygote = Zygote({**os.environ, ENV_STORE_ENDPOINT: proxy.url})
    try:
        for round_ in range(3):
            url = f"gs://{new_bucket(gcs_server)}/store"
            arts = [artifacts(inputs={"round": round_, "v": i}, files=random_files(2, seed=i),
                              created=f"2026-01-01T00:00:{i:02d}+00:00", name=f"r{round_}-{i}") for i in range(8)]
            start = time.time() + 0.5
            jobs = [{"url": url, "dirs": [str(a)], "result": str(tmp_path / f"{uuid.uuid4().hex}.json"),
                     "start_at": start} for a in arts]
            assert zygote.run(jobs) == [0] * 8
            ref = Store.from_url(url, endpoint_url=gcs_server.url).read_ref(Manifest.load(arts[0]).entry)
            assert ref["fingerprint"] == fp(arts[-1]), f"round {round_}"
    finally:
        zygote.close()


# 10 -----------------------------------------------------------------------------------------------


def test_10_a_path_through_manifest_json_is_an_integrity_error(local_url, artifacts, tmp_path):
    art = artifacts()
    ok("publish", str(art), "--store", local_url)
    store = Store.from_url(local_url)
    manifest = Manifest.load(art)
    data = manifest.to_dict()
    data["files"].append({"path": "manifest.json/x", "sha256": manifest.files[0].sha256,
                          "size": manifest.files[0].size})
    store.replace(store.manifest_path(manifest.entry, manifest.fingerprint), json.dumps(data).encode())
    one_line(aotc("fetch", "--fingerprint", fp(art), "--dest", str(tmp_path / "d"), "--store", local_url), 4)


@pytest.mark.parametrize("options", ["[1, 2]", "not json", '"a string"'])
def test_10_store_options_that_are_not_an_object_are_bad_input(local_url, tmp_path, options):
    proc = aotc("ls", "--store", local_url, env={"AOTC_STORE_OPTIONS": options})
    assert "AOTC_STORE_OPTIONS" in one_line(proc, 2)


def test_python_dash_m_aotc_is_the_cli(local_url):
    proc = subprocess.run([sys.executable, "-m", "aotc", "ls", "--json", "--store", local_url], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3 and "does not exist" in proc.stderr  # the same exit code as `aotc ls`


# 11 -----------------------------------------------------------------------------------------------


def test_11_a_kill_inside_the_fallback_swap_loses_nothing(local_url, artifacts, tmp_path):
    """Where RENAME_EXCHANGE is missing, dest is renamed to ``<staging>.old`` before the staging dir
    takes its name; this is the state a SIGKILL between the two renames leaves."""
    old, new = artifacts(inputs={"v": 1}, files=random_files(3, seed=1)), artifacts(inputs={"v": 2})
    ok("publish", str(old), str(new), "--store", local_url)
    dest = tmp_path / "run" / "xla"
    ok("fetch", "--fingerprint", fp(old), "--dest", str(dest), "--store", local_url)
    dest.rename(dest.parent / ".xla.aotc-staging-k1ll3d.old")
    (dest.parent / ".xla.aotc-staging-k1ll3d").mkdir()  # the half-built staging dir beside it
    one_line(aotc("fetch", "--fingerprint", "0" * 64, "--dest", str(dest), "--store", local_url), 3)
    assert tree(dest) == expected_dest(old)
    # and the fallback itself, forced on a kernel that has RENAME_EXCHANGE
    ok("fetch", "--fingerprint", fp(new), "--dest", str(dest), "--store", local_url,
       env={"AOTC_NO_RENAME_EXCHANGE": "1"})
    assert tree(dest) == expected_dest(new) and os.listdir(dest.parent) == ["xla"]


def start_fetch_whose_big_read_hangs(slow_store, proxy, dest: Path, *extra: str) -> subprocess.Popen:
    """``aotc fetch`` of slow_store's artifact with one ranged read of its big object hanging (the proxy's
    stall): the fetch is mid-download for as long as the test likes, however loaded the host."""
    url, _, art = slow_store
    big = next(f.sha256 for f in Manifest.load(art).files if f.path == "tp1_rank0/big")
    proxy.add("stall", match=big, times=1)
    with sigint_not_ignored():
        return subprocess.Popen([sys.executable, "-m", "aotc.cli", "fetch", "--fingerprint", fp(art), "--dest",
                                 str(dest), "--store", url, *extra], cwd=REPO,
                                env={**os.environ, **QUIET, "PYTHONFAULTHANDLER": "1"},  # see ``stderr_of``
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def stderr_of(proc: subprocess.Popen, timeout: float) -> str:
    """``proc``'s stderr once it exited; one still running after ``timeout`` seconds fails the test with its
    threads' stacks (faulthandler dumps them on SIGABRT), so a hang says where it hangs."""
    try:
        return proc.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        pytest.fail(f"still running after {timeout:g} s; its threads:\n{proc.communicate(timeout=30)[1]}")


@contextmanager
def sigint_not_ignored() -> Iterator[None]:
    """A child inherits an ignored SIGINT (pytest started as a shell's background job ignores it, and so would
    the fetch, which then never sees the test's Ctrl-C); a handled one is the default again after exec."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("sig, extra", [(signal.SIGTERM, ()), (signal.SIGTERM, ("--optional",)),
                                        (signal.SIGINT, ("--deadline", "600")), (signal.SIGINT, ())],
                         ids=["sigterm", "sigterm-optional", "sigint-deadline", "sigint"])
def test_a_fetch_stopped_by_a_signal_leaves_no_staging_dir(slow_store, proxy, tmp_path, sig, extra):
    """A pod deleted mid-fetch (SIGTERM), or Ctrl-C, while a store read hangs: the process exits at once, and
    the staging dir beside dest goes with it, in the main thread's fetch and in the deadline's (--optional,
    --deadline) alike; dest stays as it was."""
    dest = tmp_path / "pod" / "cache"
    fetch = start_fetch_whose_big_read_hangs(slow_store, proxy, dest, *extra)
    try:
        wait_for(lambda: [p for p in dest.parent.glob(f".{dest.name}.aotc-staging-*") if any(p.rglob("*"))],
                 "a staging dir with a download in it", timeout=120)
        assert fetch.poll() is None
        fetch.send_signal(sig)
        stderr = stderr_of(fetch, 60)
    finally:
        fetch.kill()
    assert os.listdir(dest.parent) == [], os.listdir(dest.parent)  # the read hung: no artifact, no staging dir
    assert fetch.returncode == 128 + sig and stderr.strip() == "aotc: interrupted", (fetch.returncode, stderr)


def test_a_fetch_whose_store_read_hangs_gives_up_at_its_deadline(slow_store, proxy, tmp_path):
    """No signal: --deadline alone ends a fetch stuck in a store read, the documented way (3, one line), with
    nothing left beside dest."""
    dest = tmp_path / "pod" / "cache"
    dest.parent.mkdir()  # a host too busy to reach the download before the deadline still leaves it empty
    fetch = start_fetch_whose_big_read_hangs(slow_store, proxy, dest, "--deadline", "5")
    try:
        stderr = stderr_of(fetch, 120)
    finally:
        fetch.kill()
    assert fetch.returncode == 3, stderr
    [line] = stderr.strip().splitlines()
    assert line.startswith("aotc: error:") and "deadline" in line
    assert os.listdir(dest.parent) == []


@pytest.mark.parametrize("stop", ["signal", "deadline"])
def test_a_stop_during_the_swap_never_leaves_a_partial_dest(local_url, artifacts, tmp_path, monkeypatch, stop):
    """Ctrl-C, SIGTERM or --deadline may come while the verified artifact is being renamed into dest: dest is
    then the whole artifact or as it was, never part of it, and no staging dir remains; a deadline lets the
    swap finish and the fetch return. In-process, with a slow swap patched in (a filesystem whose rename waits
    cannot be made here): from the stop on, it waits out the abandoning fetch's grace unless the staging dir
    loses a file (someone removing it under the swap), then swaps."""
    from aotc import fetch_dest
    from aotc.fetch import ABANDON_GRACE, FetchOptions, fetch_before

    art = artifacts(files=random_files(1000, seed=3, low=1, high=64))  # enough that removing them takes a while
    ok("publish", str(art), "--store", local_url)
    deadline = 600.0 if stop == "signal" else 2.0
    real_swap, swapping, swapped = fetch_dest.Staging.swap_into_place, threading.Event(), threading.Event()

    def files_in(staging):
        try:
            return len(os.listdir(os.path.join(staging.path, "tp1_rank0")))
        except FileNotFoundError:
            return 0

    def slow_swap(staging):
        before = files_in(staging)
        swapping.set()  # the signal comes now; the deadline at its time
        stopped_at = time.monotonic() if stop == "signal" else max(time.monotonic(), started + deadline)
        while time.monotonic() < stopped_at + ABANDON_GRACE + 1 and files_in(staging) == before:
            time.sleep(0.001)
        try:
            real_swap(staging)
        finally:
            swapped.set()

    def interrupt_the_swap():
        swapping.wait(60)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(fetch_dest.Staging, "swap_into_place", slow_swap)
    dest = tmp_path / "pod" / "cache"
    if stop == "signal":
        threading.Thread(target=interrupt_the_swap, daemon=True).start()
    started, result = time.monotonic(), None
    try:
        with sigint_not_ignored():
            result = fetch_before(local_url, str(dest), fingerprint=fp(art), options=FetchOptions(deadline=deadline))
    except (KeyboardInterrupt, DeadlineExceeded) as exc:
        assert isinstance(exc, KeyboardInterrupt) == (stop == "signal"), exc
    if swapping.is_set():  # else a host too busy to reach the swap before the deadline: it never swaps
        assert swapped.wait(10)
    left = os.listdir(dest.parent)
    whole = left == [dest.name] and tree(dest) == expected_dest(art)
    assert left == [] or whole, left
    assert stop == "signal" or (result is not None) == whole, (result, left)
