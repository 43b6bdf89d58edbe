"""A flaky network between gcsfs and the server: retry and succeed, or fail cleanly."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from aotc.errors import IntegrityError
from aotc.fetch import fetch_artifact
from aotc.manifest import Manifest
from aotc.publish import PUBLISHED, publish_artifacts
from aotc.store import Store
from aotc.store.scan import scan_store
from aotc.testing.artifacts import expected_dest, random_files, tree
from tests.conftest import run_aotc
from tests.store.conftest import new_bucket
from tests.store.test_contract import stored_bytes

DOWNLOAD = "/download/storage/v1/"
UPLOAD = "/upload/storage/v1/"
LISTING = r"/o\?"  # object listings: /storage/v1/b/<bucket>/o?prefix=…
OBJECT_GET = "/download/.*objects%2Fsha256"  # gcsfs quotes the key into the URL
MANIFEST_GET = "/download/.*manifests%2F"
# Where an object's bytes travel: gcsfs' one-request upload (under 5 MiB; its body names the object, and
# the bytes follow their part's header), and the data requests of a resumable upload (5 MiB and more).
ONE_REQUEST_UPLOAD, AFTER_PART_HEADER = "uploadType=multipart", "octet-stream\n\n"
RESUMABLE_DATA = "objects/sha256/.*upload_id="


@pytest.fixture
def url(gcs_server, proxy) -> str:
    return f"gs://{new_bucket(gcs_server)}/store"


@pytest.fixture
def art(artifacts):
    return artifacts(files=random_files(10, seed=5) | {"tp1_rank0/big": os.urandom(3 << 20)})


def test_fetch_survives_503_resets_and_short_bodies(url, art, proxy, tmp_path):
    publish_artifacts([str(art)], url)
    proxy.add("503", DOWNLOAD, per_path=True)  # every object's first GET
    proxy.add("reset", DOWNLOAD, times=3)
    proxy.add("reset_mid", DOWNLOAD, times=2)
    proxy.add("truncate", MANIFEST_GET, times=1)  # 200 with half the body: only the parser sees it
    proxy.add("truncate", OBJECT_GET, times=2)  # ... only the size/sha check sees it
    result = fetch_artifact(url, str(tmp_path / "dest"), fingerprint=Manifest.load(art).fingerprint,
                            chunk_size=1 << 20)
    assert tree(tmp_path / "dest") == expected_dest(art)
    assert proxy.injected["503"] >= 11 and proxy.injected["truncate"] == 3
    assert result.retried_objects >= 1


def test_publish_survives_503s_and_a_lost_create_reply(url, art, proxy):
    proxy.add("503", LISTING, times=2)
    proxy.add("503", UPLOAD, times=5, every=2)
    proxy.add("reset", UPLOAD, times=2, every=3)
    proxy.add("drop_response", "ifGenerationMatch=0", times=1)  # the manifest is created, the reply lost
    [result] = publish_artifacts([str(art)], url)
    assert result.status == PUBLISHED and proxy.injected["drop_response"] == 1
    proxy.clear()
    store = Store.from_url(url)
    assert not scan_store(store).warnings


def test_a_body_short_on_every_attempt_is_an_integrity_error(url, art, artifacts, proxy, tmp_path):
    earlier = artifacts(files={"tp1_rank0/keep": b"old"}, inputs={"v": "earlier"})
    publish_artifacts([str(art), str(earlier)], url)
    dest = tmp_path / "dest"  # an earlier fetch: the only kind of non-empty dest fetch replaces
    fetch_artifact(url, str(dest), fingerprint=Manifest.load(earlier).fingerprint)
    proxy.add("truncate", OBJECT_GET, times=1000)
    with pytest.raises(IntegrityError, match="after 3 attempts"):
        fetch_artifact(url, str(dest), fingerprint=Manifest.load(art).fingerprint)
    assert tree(dest) == expected_dest(earlier) and sorted(os.listdir(tmp_path)) == ["artifacts", "dest"]


def test_a_server_that_keeps_failing_fails_the_fetch_cleanly(url, art, proxy, tmp_path):
    publish_artifacts([str(art)], url)
    proxy.add("503", DOWNLOAD, times=10_000)
    with pytest.raises(Exception, match="503|injected") as info:
        fetch_artifact(url, str(tmp_path / "dest"), fingerprint=Manifest.load(art).fingerprint)
    assert not isinstance(info.value, (IntegrityError, FileNotFoundError))
    assert sorted(os.listdir(tmp_path)) == ["artifacts"]


@pytest.fixture
def both_uploads(artifacts):
    """One object per gcsfs upload kind."""
    return artifacts(entry="flips--len1", files={"tp1_rank0/small": os.urandom(64 << 10),
                                                 "tp1_rank0/large": os.urandom(6 << 20)})


def flip_uploads(proxy, times: int) -> None:
    """A network that flips one bit of an object's bytes on the way to the store (the first ``times``
    requests of each upload kind)."""
    proxy.add("flip_request", ONE_REQUEST_UPLOAD, times=times, arg=AFTER_PART_HEADER, body="objects/sha256/")
    proxy.add("flip_request", RESUMABLE_DATA, times=times)


def publish_cli(art, url) -> tuple[int, str, str]:
    proc = run_aotc("publish", str(art), "--store", url, "--json", env={"AOTC_NO_PROGRESS": "1"})
    assert "Traceback" not in proc.stderr
    return proc.returncode, proc.stdout, proc.stderr


def test_an_upload_the_store_keeps_corrupting_exits_4_and_commits_nothing(url, artifacts, both_uploads, proxy):
    earlier = artifacts(entry="flips--len1", files=random_files(3, seed=6), inputs={"v": "earlier"})
    publish_artifacts([str(earlier)], url)
    store = Store.from_url(url)
    before, manifests_before = stored_bytes(store), store.find("manifests")
    flip_uploads(proxy, times=1000)
    code, _, stderr = publish_cli(both_uploads, url)
    assert code == 4 and stderr.splitlines()[-1].startswith("aotc: error: ")
    assert "crc32c" in stderr and "after 3 uploads" in stderr and "no manifest written" in stderr
    proxy.clear()
    assert store.find("manifests").keys() == manifests_before.keys()
    assert store.read_ref("flips--len1")["fingerprint"] == Manifest.load(earlier).fingerprint
    assert {sha: data for sha, data in stored_bytes(store).items() if sha in before} == before
    # what the failed publish left is unreferenced: the next publish over a sound network replaces it
    code, stdout, _ = publish_cli(both_uploads, url)
    assert code == 0 and json.loads(stdout)["published"][0]["status"] == PUBLISHED


def test_a_transient_flip_is_uploaded_again_and_published_intact(url, both_uploads, proxy, tmp_path):
    flip_uploads(proxy, times=1)  # each object's first upload arrives corrupt
    proxy.add("pass", OBJECT_GET, times=10**6)  # counts object downloads: the check must need none
    code, stdout, stderr = publish_cli(both_uploads, url)
    assert code == 0, stderr
    [result] = json.loads(stdout)["published"]
    assert result["status"] == PUBLISHED and result["retried_uploads"] == 2 == proxy.injected["flip_request"]
    assert stderr.count("uploading it again") == 2 and proxy.injected["pass"] == 0
    proxy.clear()
    stored = stored_bytes(Store.from_url(url))
    assert all(hashlib.sha256(data).hexdigest() == sha for sha, data in stored.items())
    fetch_artifact(url, str(tmp_path / "dest"), fingerprint=Manifest.load(both_uploads).fingerprint)
    assert tree(tmp_path / "dest") == expected_dest(both_uploads)
