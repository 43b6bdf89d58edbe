"""Fixtures for the store tests: a loopback fake GCS server, per-test stores on three backends."""

from __future__ import annotations

import os

os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"  # before gcsfs is imported, or calls stall

import time
import types
import uuid
from pathlib import Path

import pytest

from aotc.store import ENV_STORE_ENDPOINT, Store
from aotc.testing.artifacts import make_artifact, random_files
from aotc.testing.faultproxy import FaultProxy
from aotc.testing.gcs_server import FakeGcs
from tests.conftest import run_aotc


@pytest.fixture(scope="session")
def gcs_server():
    with FakeGcs() as server:
        yield server


@pytest.fixture
def gcs_endpoint(gcs_server, monkeypatch):
    """CLI subprocesses and Store.from_url find the server through the environment."""
    monkeypatch.setenv(ENV_STORE_ENDPOINT, gcs_server.url)
    return gcs_server.url


def new_bucket(server: FakeGcs) -> str:
    return server.make_bucket(f"aotc-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def gcs_url(gcs_server, gcs_endpoint) -> str:
    return f"gs://{new_bucket(gcs_server)}/store"


@pytest.fixture
def local_url(tmp_path) -> str:
    return str(tmp_path / "store")


@pytest.fixture
def memory_url() -> str:
    return f"memory://aotc-{uuid.uuid4().hex}"


@pytest.fixture(params=["memory", "local", "gcs"])
def any_url(request) -> str:
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture
def proxy(gcs_server, monkeypatch):
    """A fault proxy in front of the server; gcsfs' retry backoff shortened 50x to keep tests fast."""
    import asyncio

    import gcsfs.retry

    real_sleep = asyncio.sleep
    monkeypatch.setattr(gcsfs.retry, "asyncio", types.SimpleNamespace(sleep=lambda s: real_sleep(s / 50)))
    with FaultProxy(gcs_server.url) as p:
        monkeypatch.setenv(ENV_STORE_ENDPOINT, p.url)
        yield p


@pytest.fixture
def artifacts(tmp_path):
    """make(**kw) -> artifact dir under tmp_path/artifacts."""
    root = tmp_path / "artifacts"

    def make(entry: str = "model-a--len2048-tp1", files=None, seed: int = 0, **kw) -> Path:
        files = random_files(6, seed=seed) if files is None else files
        return make_artifact(root, entry=entry, files=files, **kw)

    return make


def store_of(url: str) -> Store:
    return Store.from_url(url)


def wait_for(predicate, what: str, timeout: float = 60.0):
    """Poll until ``predicate()`` is truthy (returned), failing the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


@pytest.fixture
def slow_store(gcs_server, proxy, tmp_path):
    """(gs url, local-folder url) holding the same published artifact with a 20 MiB object (streamed in
    ranges, so its download is on disk while the store is slow) and a few small ones."""
    url = f"gs://{new_bucket(gcs_server)}/store"
    files = random_files(4, seed=7) | {"tp1_rank0/big": os.urandom(20 << 20)}
    art = make_artifact(tmp_path / "art", entry="slow--x", files=files)
    local = str(tmp_path / "local-store")
    for where in (url, local):
        assert run_aotc("publish", art, "--store", where).returncode == 0
    return url, local, art
