"""Publishers SIGKILLed at many moments, and publishers racing: the store stays consistent."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from aotc.fetch import fetch_artifact
from aotc.manifest import Manifest
from aotc.publish import ALREADY, OTHER_WON, PUBLISHED, publish_artifacts
from aotc.store import ENV_STORE_ENDPOINT, Store
from aotc.store.scan import scan_store
from aotc.testing.artifacts import expected_dest, random_files, tree
from tests.store.conftest import new_bucket

REPO = Path(__file__).resolve().parents[2]


class Zygote:
    def __init__(self, env: dict[str, str]):
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.publisher_zygote"], cwd=REPO,
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "READY"

    def run(self, jobs: list[dict]) -> list[int]:
        self.proc.stdin.write(json.dumps(jobs) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(10)


@pytest.fixture(scope="module")
def zygote(gcs_server):
    z = Zygote({**os.environ, ENV_STORE_ENDPOINT: gcs_server.url})
    yield z
    z.close()


@pytest.fixture(params=["local", "gcs"])
def fresh_url(request, tmp_path, gcs_server, gcs_endpoint):
    """A factory of empty stores on one backend."""
    if request.param == "local":
        return lambda: str(tmp_path / f"store-{uuid.uuid4().hex[:8]}")
    bucket = new_bucket(gcs_server)
    return lambda: f"gs://{bucket}/{uuid.uuid4().hex[:8]}"


def assert_consistent(url: str) -> None:
    """Every manifest parses, and every object it names exists with exactly the recorded bytes."""
    store = Store.from_url(url)
    if not store.exists():
        return
    info = scan_store(store)
    assert not info.warnings, info.warnings
    for entry in info.entries:
        for m in entry.manifests:
            manifest = Manifest.from_json(store.read(m.path))
            for record in manifest.files:
                data = store.read(store.object_path(record.sha256))
                assert (len(data), hashlib.sha256(data).hexdigest()) == (record.size, record.sha256)


def crash_artifact(artifacts) -> Path:
    # one object over 5 MiB takes gcsfs' resumable-upload path; the rest are single-request uploads
    files = random_files(11, seed=7, low=1 << 10, high=64 << 10) | {"tp1_rank0/big": os.urandom(6 << 20)}
    return artifacts(files=files)


WRITES_PER_PUBLISH = 1 + 12 + 1 + 1  # lease, objects, manifest, ref


def test_sigkill_at_every_write_leaves_a_consistent_store(zygote, fresh_url, artifacts, tmp_path, request):
    art = crash_artifact(artifacts)
    modes = ["before", "during"] + (["mid"] if "local" in request.node.callspec.id else [])
    points = [(op, mode) for op in range(1, WRITES_PER_PUBLISH + 1) for mode in modes
              if mode != "mid" or 2 <= op <= 13]
    jobs = [{"url": fresh_url(), "dirs": [str(art)], "result": str(tmp_path / f"r{i}.json"),
             "kill": {"op": op, "mode": mode, "delay": 0.001 + 0.001 * (i % 5)}}
            for i, (op, mode) in enumerate(points)]
    statuses = [s for batch in range(0, len(jobs), 6) for s in zygote.run(jobs[batch:batch + 6])]
    assert set(statuses) <= {-9, 0} and statuses.count(-9) >= 20, list(zip(points, statuses))
    for i, job in enumerate(jobs):
        assert_consistent(job["url"])
        [rerun] = publish_artifacts([str(art)], job["url"])
        assert rerun.status in (PUBLISHED, ALREADY)
        assert_consistent(job["url"])
        if i % 10 == 0:
            fetch_artifact(job["url"], str(tmp_path / "dest"), fingerprint=rerun.fingerprint)
            assert tree(tmp_path / "dest") == expected_dest(art)


@pytest.mark.parametrize("different", [False, True], ids=["same-artifact", "same-fingerprint"])
def test_racing_publishers(zygote, fresh_url, artifacts, tmp_path, different):
    """6 processes publish at once; with ``different`` each has its own bytes under one fingerprint."""
    n = 6
    arts = [artifacts(files=random_files(8, seed=100 + (i if different else 0)) | {"big": os.urandom(1 << 20)},
                      name=f"racer{i}") for i in range(n if different else 1)]
    url = fresh_url()
    start = time.time() + 0.5
    jobs = [{"url": url, "dirs": [str(arts[i % len(arts)])], "result": str(tmp_path / f"race{i}.json"),
             "start_at": start} for i in range(n)]
    statuses = zygote.run(jobs)
    results = [json.loads((tmp_path / f"race{i}.json").read_text())[0] for i in range(n)]
    assert statuses == [0] * n, results
    assert_consistent(url)
    store = Store.from_url(url)
    assert len(store.find("manifests")) == 1
    winners = [r for r in results if r["status"] == PUBLISHED]
    assert winners
    if different:
        assert len(winners) == 1 and all(r["status"] == OTHER_WON for r in results if r not in winners)
        [winner_dir] = {r["artifact_dir"] for r in winners}
        fetch_artifact(url, str(tmp_path / "dest"), fingerprint=results[0]["fingerprint"])
        assert tree(tmp_path / "dest") == expected_dest(winner_dir)
    else:
        assert {r["status"] for r in results} <= {PUBLISHED, ALREADY}


def test_gc_running_beside_publishers_never_breaks_the_newest_manifest(fresh_url, artifacts):
    """Each round publishes a new newest version that reuses the objects of an older, gc'd one while gc
    (keep=1, no age grace) runs in a loop: the publisher finds those objects present and skips them, so
    only the publish lease stops gc from deleting them under it."""
    import threading

    url = fresh_url()
    store = Store.from_url(url)
    shared = random_files(3, seed=60)
    uniques = [random_files(3, seed=70 + i, prefix=f"v{i}") for i in range(3)]
    stop, errors, runs = threading.Event(), [], [0]

    def collect() -> None:
        gc_store = Store.from_url(url)
        while not stop.is_set():
            try:
                scan_store(gc_store).gc(keep=1, min_age=0).execute(gc_store)
                runs[0] += 1
            except Exception as exc:  # reported below, not swallowed
                errors.append(exc)

    # older than every round: with keep=1 each round's manifest is the newest once published (the fixture's
    # default `created` is now, which made round -1 the newest and let gc drop a just-published round)
    publish_artifacts([str(artifacts(files=shared | uniques[0], inputs={"round": -1},
                                     created="2025-12-31T23:59:59+00:00"))], url)
    worker = threading.Thread(target=collect)
    worker.start()
    try:
        for r in range(12):
            art = artifacts(files=shared | uniques[r % 3], inputs={"round": r},
                            created=f"2026-01-01T00:00:{r:02d}+00:00")
            [result] = publish_artifacts([str(art)], url)
            manifest, _ = store.read_manifest(result.entry, result.fingerprint)
            present, _ = store.list_objects()
            assert {f.sha256 for f in manifest.files} <= set(present), f"round {r}"
    finally:
        stop.set()
        worker.join(30)
    assert not errors and runs[0] >= 3
    assert_consistent(url)
