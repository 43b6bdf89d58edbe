"""publish / fetch / ls / gc through the real CLI: exit codes 0, 2, 3, 4 and their --json documents."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aotc.fingerprint import fingerprint_entry
from aotc.manifest import Manifest
from aotc.matrix import load_matrix
from aotc.store import ENV_STORAGE_EMULATOR, ENV_STORE, ENV_STORE_ENDPOINT, Store, resolve_store_url
from tests.conftest import CONFIGS, run_aotc
from tests.helpers.cli import json_output, one_line_error
from aotc.testing.artifacts import expected_dest, random_files, tree

DEMO = CONFIGS / "demo.yaml"


def ok_json(*args: str, env: dict | None = None) -> dict:
    return json_output(run_aotc(*args, "--json", env={"AOTC_NO_PROGRESS": "1", **(env or {})}))


def fails(code: int, *args: str, env: dict | None = None) -> str:
    return one_line_error(run_aotc(*args, env=env), code)


@pytest.fixture
def demo_entry():
    entry = load_matrix(DEMO).entry("tiny-llama--len128-seqs8-tok64-tp1")
    return entry, fingerprint_entry(entry)


def test_publish_fetch_ls_gc_json(local_url, artifacts, tmp_path):
    old = artifacts(inputs={"v": 1}, created="2026-01-01T00:00:00+00:00", files=random_files(3, seed=1))
    new = artifacts(inputs={"v": 2}, created="2026-01-02T00:00:00+00:00", files=random_files(4, seed=2))
    doc = ok_json("publish", str(old), str(new), "--store", local_url)
    assert doc["store"] == local_url and [p["status"] for p in doc["published"]] == ["published"] * 2

    fp = Manifest.load(new).fingerprint
    fetched = ok_json("fetch", "--fingerprint", fp, "--dest", str(tmp_path / "dest"), "--store", local_url)
    assert fetched["fingerprint"] == fp and fetched["files"] == 4
    assert tree(tmp_path / "dest") == expected_dest(new)

    listing = ok_json("ls", "--store", local_url)
    [entry] = listing["entries"]
    assert entry["ref"] == fp and [m["fingerprint"] for m in entry["manifests"]][0] == fp

    dry = ok_json("gc", "--keep", "1", "--dry-run", "--store", local_url, env={"AOTC_GC_MIN_AGE_SECONDS": "0"})
    assert dry["dry_run"] and len(dry["objects_to_delete"]) == 3 and dry["report"] is None
    done = ok_json("gc", "--keep", "1", "--store", local_url, env={"AOTC_GC_MIN_AGE_SECONDS": "0"})
    assert done["report"]["deleted_objects"] == 3 and done["report"]["deleted_manifests"] == 1
    assert len(ok_json("ls", "--store", local_url)["entries"][0]["manifests"]) == 1


def test_store_from_env_and_gcs_through_the_cli(gcs_url, artifacts, tmp_path):
    art = artifacts(files=random_files(5, seed=3) | {"big": os.urandom(1 << 20)})
    doc = ok_json("publish", str(art), env={ENV_STORE: gcs_url})
    assert doc["store"] == gcs_url and doc["published"][0]["uploaded_objects"] == 6
    fp = Manifest.load(art).fingerprint
    ok_json("fetch", "--fingerprint", fp, "--dest", str(tmp_path / "dest"), env={ENV_STORE: gcs_url})
    assert tree(tmp_path / "dest") == expected_dest(art)


def test_fetch_by_config_and_entry(local_url, artifacts, tmp_path, demo_entry):
    entry, fp = demo_entry
    art = artifacts(entry=entry.name, inputs=fp.inputs, fingerprint=fp.digest)
    ok_json("publish", str(art), "--store", local_url)
    doc = ok_json("fetch", "--config", str(DEMO), "--entry", entry.name, "--dest", str(tmp_path / "d"),
                  "--store", local_url)
    assert doc["fingerprint"] == fp.digest


def test_not_found_names_the_inputs_that_differ(local_url, artifacts, tmp_path, demo_entry):
    entry, fp = demo_entry
    dest = ["--dest", str(tmp_path / "d"), "--store", local_url]
    message = fails(3, "fetch", "--config", str(DEMO), "--entry", entry.name, *dest)
    assert "nothing is published for this entry" in message or "does not exist" in message
    near = {**fp.inputs, "max_num_seqs": 16, "versions": {**fp.inputs["versions"], "vllm": "0.12.0"}}
    far = {**near, "dtype": "float32", "xla_flags": ["XLA_FLAGS:--xla_x=1"]}
    for inputs in (far, near):
        ok_json("publish", str(artifacts(entry=entry.name, inputs=inputs)), "--store", local_url)
    message = fails(3, "fetch", "--config", str(DEMO), "--entry", entry.name, *dest)
    assert "differs in 2 input(s)" in message and "max_num_seqs" in message and "versions.vllm" in message
    assert "0.12.0" in message and not (tmp_path / "d").exists()
    fails(3, "fetch", "--fingerprint", "0" * 64, *dest)


def test_integrity_failures_exit_4_and_keep_the_old_dest(local_url, artifacts, tmp_path):
    art = artifacts()
    earlier = artifacts(files={"tp1_rank0/old": b"keep me"}, inputs={"v": "earlier"})
    ok_json("publish", str(art), str(earlier), "--store", local_url)
    dest = tmp_path / "dest"  # an earlier fetch: the only kind of non-empty dest fetch replaces
    ok_json("fetch", "--fingerprint", Manifest.load(earlier).fingerprint, "--dest", str(dest), "--store", local_url)
    store = Store.from_url(local_url)
    victim = Manifest.load(art).files[0]
    path = Path(store.object_path(victim.sha256))
    path.write_bytes(b"X" + path.read_bytes()[1:])
    message = fails(4, "fetch", "--fingerprint", Manifest.load(art).fingerprint, "--dest", str(dest),
                    "--store", local_url)
    assert victim.sha256 in message and victim.path in message
    assert tree(dest) == expected_dest(earlier)


def test_publishing_a_tampered_artifact_exits_4(local_url, artifacts):
    art = artifacts()
    victim = art / "cache" / Manifest.load(art).files[0].path
    victim.write_bytes(b"changed after the build")
    assert str(victim) in fails(4, "publish", str(art), "--store", local_url)


@pytest.mark.parametrize("args", [
    ["publish", "/nonexistent-artifact-dir"],
    ["fetch", "--fingerprint", "../../etc", "--dest", "/tmp/aotc-never"],
    ["fetch", "--fingerprint", "ab", "--config", str(DEMO), "--entry", "x", "--dest", "/tmp/aotc-never"],
    ["gc", "--keep", "-1"],
])
def test_bad_input_exits_2(args, local_url, artifacts):
    ok_json("publish", str(artifacts()), "--store", local_url)
    fails(2, *args, "--store", local_url)


# .invalid never resolves (RFC 2606): the resolver's answer is "no such name", not "try again"
NO_SUCH_HOST = "nonexistent.invalid"


EMULATOR = {ENV_STORAGE_EMULATOR: f"http://{NO_SUCH_HOST}:1", ENV_STORE_ENDPOINT: ""}


@pytest.mark.parametrize("args, endpoint", [
    (["ls"], EMULATOR),
    (["ls"], {ENV_STORE_ENDPOINT: f"{NO_SUCH_HOST}:1"}),
    (["fetch", "--fingerprint", "ab" * 32, "--dest", "{tmp}/dest", "--optional"], EMULATOR),
    (["publish", "{artifact}"], EMULATOR),
])
def test_a_store_host_that_does_not_resolve_is_one_line_and_exit_2_without_retries(args, endpoint, artifacts,
                                                                                     tmp_path):
    """Not a transient fault: no credential probe, none of gcsfs' retries (its debug log would show them)."""
    args = [a.format(tmp=tmp_path, artifact=artifacts()) for a in args]
    line = fails(2, *args, "--store", "gs://bucket/store", env=endpoint)
    assert f"host {NO_SUCH_HOST} does not resolve" in line, line
    debug = run_aotc(*args, "--store", "gs://bucket/store", env={**endpoint, "AOTC_DEBUG": "1"})
    assert f"host {NO_SUCH_HOST} does not resolve" in debug.stderr and "retrying" not in debug.stderr, \
        debug.stderr[-3000:]
    assert not (tmp_path / "dest").exists()


def test_store_url_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_STORE, raising=False)
    monkeypatch.chdir(tmp_path)
    assert resolve_store_url(None) == str(tmp_path / ".aotc" / "store")
    assert resolve_store_url(None, "gs://cfg/x") == "gs://cfg/x"
    monkeypatch.setenv(ENV_STORE, "memory://env")
    assert resolve_store_url(None, "gs://cfg/x") == "memory://env"
    assert resolve_store_url("/cli", "gs://cfg/x") == "/cli"


def test_human_output(local_url, artifacts, tmp_path):
    art = artifacts()
    fp = Manifest.load(art).fingerprint
    for args, expect in ((["publish", str(art)], "published"),
                         (["fetch", "--fingerprint", fp, "--dest", str(tmp_path / "d")], "fetched"),
                         (["ls"], fp[:16]), (["gc", "--keep", "0", "--dry-run"], "would delete 1 manifest")):
        proc = run_aotc(*args, "--store", local_url, env={"AOTC_NO_PROGRESS": "1", "COLUMNS": "200"})
        assert proc.returncode == 0 and expect in proc.stdout, (args, proc.stdout, proc.stderr)
