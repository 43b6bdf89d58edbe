"""The store contract, one mixin run against memory://, a local folder and the loopback GCS server."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from aotc.errors import IntegrityError, NotFoundInStore
from aotc.fetch import fetch_artifact
from aotc.manifest import Manifest
from aotc.publish import ALREADY, OTHER_WON, PUBLISHED, publish_artifacts
from aotc.store import Store
from aotc.store.leases import hold
from aotc.store.scan import scan_store
from aotc.testing.artifacts import expected_dest, random_files, tree


def fingerprint_of(artifact: Path) -> str:
    return Manifest.load(artifact).fingerprint


def listing(path: Path) -> set[str]:
    return set(os.listdir(path))


def stored_bytes(store: Store) -> dict[str, bytes]:
    return {sha: store.read(store.object_path(sha)) for sha in store.list_objects()[0]}


class StoreContract:
    """Subclasses provide the ``url`` fixture."""

    def publish(self, url: str, *dirs: Path):
        return publish_artifacts([str(d) for d in dirs], url)

    def fetch(self, url: str, artifact: Path, dest: Path, **kw):
        return fetch_artifact(url, str(dest), fingerprint=fingerprint_of(artifact), **kw)

    # round trip and dedup

    def test_round_trip_is_byte_identical(self, url, artifacts, tmp_path):
        files = random_files(8, seed=1) | {"tp1_rank0/large": os.urandom(3 << 20), "tp1_rank0/empty": b""}
        art = artifacts(files=files)
        [result] = self.publish(url, art)
        assert result.status == PUBLISHED and result.uploaded_objects == 10
        fetched = self.fetch(url, art, tmp_path / "dest", chunk_size=1 << 20)  # large object: ranged reads
        assert tree(tmp_path / "dest") == expected_dest(art)
        assert fetched.files == 10 and fetched.size == sum(map(len, files.values()))

    def test_second_artifact_uploads_only_new_objects(self, url, artifacts):
        shared = random_files(5, seed=2)
        first = artifacts(files=shared | random_files(2, seed=3), entry="a--len1")
        second = artifacts(files=shared | random_files(3, seed=4), entry="b--len1")
        self.publish(url, first)
        [result] = self.publish(url, second)
        assert (result.uploaded_objects, result.reused_objects) == (3, 5)

    def test_identical_duplicate_files_are_one_object(self, url, artifacts, tmp_path):
        art = artifacts(files={"a/x": b"same", "b/y": b"same", "c": b"other"})
        [result] = self.publish(url, art)
        assert result.uploaded_objects == 2
        self.fetch(url, art, tmp_path / "dest")
        assert tree(tmp_path / "dest") == expected_dest(art)

    def test_republish_is_a_noop(self, url, artifacts):
        art = artifacts()
        self.publish(url, art)
        [again] = self.publish(url, art)
        assert again.status == ALREADY and again.uploaded_objects == 0

    def test_a_different_manifest_for_the_same_fingerprint_loses(self, url, artifacts):
        first = artifacts(created="2026-01-01T00:00:00+00:00", name="one")
        second = artifacts(created="2026-01-02T00:00:00+00:00", name="two")
        assert fingerprint_of(first) == fingerprint_of(second)
        self.publish(url, first)
        [result] = self.publish(url, second)
        assert result.status == OTHER_WON
        manifest, _ = Store.from_url(url).read_manifest(result.entry, result.fingerprint)
        assert manifest.created.startswith("2026-01-01")

    def test_create_is_exclusive(self, url):
        store = Store.from_url(url)
        path = store.manifest_path("e", "f")
        store.create(path, b"one")
        with pytest.raises(FileExistsError, match="already exists"):
            store.create(path, b"two")
        assert store.read(path) == b"one"

    def test_ref_follows_the_newest_manifest(self, url, artifacts):
        old = artifacts(inputs={"v": 1}, created="2026-01-01T00:00:00+00:00")
        new = artifacts(inputs={"v": 2}, created="2026-02-01T00:00:00+00:00")
        store = Store.from_url(url)
        self.publish(url, new)
        self.publish(url, old)  # published later, built earlier: the ref stays
        assert store.read_ref("model-a--len2048-tp1")["fingerprint"] == fingerprint_of(new)

    def test_publish_refuses_a_corrupt_artifact_before_uploading(self, url, artifacts):
        art = artifacts()
        victim = next(p for p in (art / "cache").rglob("*") if p.is_file())
        victim.write_bytes(victim.read_bytes() + b"!")
        with pytest.raises(IntegrityError, match=str(victim)):
            self.publish(url, art)
        store = Store.from_url(url)
        assert not store.exists() or store.list_objects()[0] == {}

    # not found

    def test_a_file_changed_after_its_check_is_never_published(self, url, artifacts):
        """A file rewritten between publish's sha256 check and its upload (a builder still writing it): what
        the store then holds (GCS: its crc32c; elsewhere the stored bytes re-hashed) is not the checked
        bytes, so it is uploaded again, then refused; no manifest, no ref, the earlier objects untouched."""
        from fsspec.callbacks import NoOpCallback

        self.publish(url, artifacts(files=random_files(3, seed=8), entry="a--len1"))
        store = Store.from_url(url)
        before = stored_bytes(store)
        art = artifacts(files=random_files(4, seed=9), entry="b--len1")
        victim = next(p for p in (art / "cache").rglob("*") if p.is_file())

        class RewriteAfterTheCheck(NoOpCallback):
            def set_size(self, size):  # publish sizes its meter after checking every file, before uploading
                data = bytearray(victim.read_bytes())
                data[0] ^= 1
                victim.write_bytes(bytes(data))

        with pytest.raises(IntegrityError, match=f"after 3 uploads of {victim}"):
            publish_artifacts([str(art)], url, callback=RewriteAfterTheCheck())
        assert not store.find("manifests/b--len1") and store.read_ref("b--len1") is None
        assert {sha: data for sha, data in stored_bytes(store).items() if sha in before} == before

    def test_fetch_unknown_fingerprint_is_not_found(self, url, artifacts, tmp_path):
        self.publish(url, artifacts())
        with pytest.raises(NotFoundInStore, match="no artifact with fingerprint"):
            fetch_artifact(url, str(tmp_path / "dest"), fingerprint="0" * 64)

    def test_fetch_from_empty_store_is_not_found(self, url, tmp_path):
        with pytest.raises(NotFoundInStore):
            fetch_artifact(url, str(tmp_path / "dest"), fingerprint="0" * 64)

    # tampering: exit 4 (3 when missing), nothing outside dest, the old dest survives

    def _published_with_old_dest(self, url, artifacts, tmp_path):
        old = artifacts(files={"tp1_rank0/old": b"previous"}, inputs={"v": "old"})
        art = artifacts(files=random_files(4, seed=9) | {"tp1_rank0/big": os.urandom(2 << 20)})
        self.publish(url, old, art)
        dest = tmp_path / "run" / "xla"
        self.fetch(url, old, dest)
        before = tree(dest), listing(dest.parent)
        return art, dest, before

    def _assert_untouched(self, dest: Path, before) -> None:
        assert (tree(dest), listing(dest.parent)) == before

    def _object_path(self, store: Store, art: Path, name: str = "tp1_rank0/big") -> str:
        record = next(f for f in Manifest.load(art).files if f.path == name)
        return store.object_path(record.sha256)

    def test_flipped_byte(self, url, artifacts, tmp_path):
        art, dest, before = self._published_with_old_dest(url, artifacts, tmp_path)
        store = Store.from_url(url)
        path = self._object_path(store, art)
        data = bytearray(store.read(path))
        data[len(data) // 2] ^= 1
        store.replace(path, bytes(data))
        with pytest.raises(IntegrityError, match="sha256"):
            self.fetch(url, art, dest, chunk_size=1 << 20)
        self._assert_untouched(dest, before)

    def test_truncated_object(self, url, artifacts, tmp_path):
        art, dest, before = self._published_with_old_dest(url, artifacts, tmp_path)
        store = Store.from_url(url)
        path = self._object_path(store, art)
        store.replace(path, store.read(path)[:1000])
        with pytest.raises(IntegrityError, match="truncated"):
            self.fetch(url, art, dest, chunk_size=1 << 20)
        self._assert_untouched(dest, before)

    def test_missing_object(self, url, artifacts, tmp_path):
        art, dest, before = self._published_with_old_dest(url, artifacts, tmp_path)
        store = Store.from_url(url)
        store.fs.rm_file(self._object_path(store, art))
        with pytest.raises(NotFoundInStore, match="missing"):
            self.fetch(url, art, dest)
        self._assert_untouched(dest, before)

    @pytest.mark.parametrize("evil", ["../x", "/etc/x", "a/../../x", "manifest.json", "a//b"])
    def test_unsafe_manifest_path(self, url, artifacts, tmp_path, evil):
        art, dest, before = self._published_with_old_dest(url, artifacts, tmp_path)
        self._plant_manifest(url, art, {"path": evil, "sha256": "0" * 64, "size": 1})
        with pytest.raises(IntegrityError, match="unsafe path|reserved"):
            self.fetch(url, art, dest)
        self._assert_untouched(dest, before)
        assert not (tmp_path / "x").exists()

    def test_path_through_a_link_in_dest(self, url, artifacts, tmp_path):
        art, dest, before = self._published_with_old_dest(url, artifacts, tmp_path)
        outside = tmp_path / "outside"
        outside.mkdir()
        (dest / "tp1_rank0").rename(dest / "moved")
        (dest / "tp1_rank0").symlink_to(outside)
        before = tree(dest), listing(dest.parent)
        with pytest.raises(IntegrityError, match="link"):
            self.fetch(url, art, dest)
        self._assert_untouched(dest, before)
        assert list(outside.iterdir()) == []

    def test_a_sha256_that_is_a_path(self, url, artifacts, tmp_path):
        art, dest, before = self._published_with_old_dest(url, artifacts, tmp_path)
        self._plant_manifest(url, art, {"path": "x", "sha256": "../../refs/x", "size": 1})
        with pytest.raises(IntegrityError, match="not hex"):
            self.fetch(url, art, dest)
        self._assert_untouched(dest, before)

    def test_path_through_a_file_in_the_manifest(self, url, artifacts, tmp_path):
        art, dest, before = self._published_with_old_dest(url, artifacts, tmp_path)
        self._plant_manifest(url, art, {"path": "tp1_rank0/big/x", "sha256": "0" * 64, "size": 1})
        with pytest.raises(IntegrityError, match="goes through"):
            self.fetch(url, art, dest)
        self._assert_untouched(dest, before)

    def _plant_manifest(self, url: str, art: Path, extra_record: dict) -> None:
        """Overwrite the stored manifest with one that also lists ``extra_record``."""
        store = Store.from_url(url)
        manifest = Manifest.load(art)
        data = manifest.to_dict()
        data["files"].append(extra_record)
        store.replace(store.manifest_path(manifest.entry, manifest.fingerprint),
                           json.dumps(data).encode())

    # ls / scan

    def test_scan_lists_entries_refs_and_damage(self, url, artifacts):
        a1 = artifacts(entry="a--x", inputs={"v": 1}, created="2026-01-01T00:00:00+00:00")
        a2 = artifacts(entry="a--x", inputs={"v": 2}, created="2026-01-02T00:00:00+00:00")
        b = artifacts(entry="b--x")
        self.publish(url, a1, a2, b)
        store = Store.from_url(url)
        store.replace(store.manifest_path("c--x", "f" * 64), b"{not json")
        info = scan_store(store)
        by_name = {e.name: e for e in info.entries}
        assert [m.fingerprint for m in by_name["a--x"].manifests] == [fingerprint_of(a2), fingerprint_of(a1)]
        assert by_name["a--x"].ref == fingerprint_of(a2)
        assert any(w.kind == "damaged_manifest" and "not valid JSON" in w.message for w in info.warnings)
        doc = json.loads(json.dumps(info.to_dict()))
        assert doc["objects"] == len(info.objects) and doc["unreferenced_objects"] == 0

    # gc

    def test_gc_keeps_newest_and_deletes_only_unreferenced(self, url, artifacts):
        shared = random_files(3, seed=20)
        arts = [artifacts(files=shared | random_files(2, seed=30 + i), inputs={"v": i},
                          created=f"2026-01-0{i + 1}T00:00:00+00:00") for i in range(4)]
        other = artifacts(entry="other--x", files=random_files(2, seed=40))
        self.publish(url, *arts, other)
        store = Store.from_url(url)
        plan = scan_store(store).gc(keep=2, min_age=0)
        assert {m.fingerprint for m in plan.manifests_to_delete} == {fingerprint_of(a) for a in arts[:2]}
        assert len(plan.objects_to_delete) == 4 and plan.expected_freed_size > 0
        report = plan.execute(store)
        assert (report.deleted_manifests, report.deleted_objects) == (2, 4)
        after = scan_store(store)
        assert not after.warnings
        assert {o.sha256 for o in after.objects} == set(after.referenced)
        for kept in arts[2:] + [other]:
            Manifest.from_json(store.read(store.manifest_path(Manifest.load(kept).entry, fingerprint_of(kept))))

    def test_gc_spares_young_objects(self, url, artifacts):
        self.publish(url, artifacts(inputs={"v": 1}))
        store = Store.from_url(url)
        plan = scan_store(store).gc(keep=0)  # default min_age: an hour
        assert plan.objects_to_delete == () and len(plan.objects_too_new) == 6
        plan.execute(store)
        assert len(store.list_objects()[0]) == 6

    def test_gc_defers_objects_while_a_publish_is_in_flight(self, url, artifacts):
        self.publish(url, artifacts())
        store = Store.from_url(url)
        plan = scan_store(store).gc(keep=0, min_age=0)
        with hold(store, "publish"):
            report = plan.execute(store)
        assert report.deleted_manifests == 1 and report.deferred_objects == 6 and report.deleted_objects == 0
        assert len(store.list_objects()[0]) == 6
        assert scan_store(store).gc(keep=0, min_age=0).execute(store).deleted_objects == 6

    def test_gc_rescans_manifests_before_deleting_objects(self, url, artifacts):
        files = random_files(4, seed=50)
        old = artifacts(files=files, inputs={"v": 1})
        self.publish(url, old)
        store = Store.from_url(url)
        plan = scan_store(store).gc(keep=0, min_age=0)
        self.publish(url, artifacts(files=files, inputs={"v": 2}))  # reuses every object after the plan
        report = plan.execute(store)
        assert report.deleted_objects == 0 and report.spared_referenced == 4
        assert not scan_store(store).warnings

    def test_publisher_waits_for_a_running_gc(self, url, artifacts):
        import threading

        store = Store.from_url(url)
        art = artifacts()
        done = threading.Event()
        with hold(store, "gc"):
            worker = threading.Thread(target=lambda: (self.publish(url, art), done.set()))
            worker.start()
            assert not done.wait(1.0)
            assert not store.find("manifests")
        worker.join(10)
        assert done.is_set() and store.find("manifests")

    def test_a_dead_gc_lock_expires(self, url, artifacts):
        import time

        store = Store.from_url(url)
        store.replace(f"{store.root}/locks/gc-deadbeef.json", b"{}")  # a gc killed mid-run
        store.gc_lock_ttl = 1.0
        started = time.monotonic()
        [result] = publish_artifacts([str(artifacts())], url, store=store)
        assert result.status == PUBLISHED and 0.4 < time.monotonic() - started < 10


class TestMemory(StoreContract):
    @pytest.fixture
    def url(self, memory_url):
        return memory_url


class TestLocal(StoreContract):
    @pytest.fixture
    def url(self, local_url):
        return local_url

    def test_leftover_temp_files_are_ignored_and_collected(self, url, artifacts):
        self.publish(url, artifacts())
        store = Store.from_url(url)
        some = next(iter(store.list_objects()[0].values()))
        stray = Path(store.object_path(some.sha256)).with_name(f".{some.sha256}.tmp-dead")
        stray.write_bytes(b"partial")
        os.utime(stray, (1, 1))
        assert len(store.list_objects()[0]) == 6
        plan = scan_store(store).gc(keep=1)
        assert plan.temp_files_to_delete == (str(stray),)
        plan.execute(store)
        assert not stray.exists()


class TestGcs(StoreContract):
    @pytest.fixture
    def url(self, gcs_url):
        return gcs_url


def test_manifest_records_with_mismatched_sizes_are_refused(memory_url, artifacts, tmp_path):
    art = artifacts(files={"a": b"x", "b": b"x"})
    store = Store.from_url(memory_url)
    publish_artifacts([str(art)], memory_url)
    manifest = Manifest.load(art)
    bad = manifest.to_dict()
    bad["files"][1]["size"] = 7
    store.replace(store.manifest_path(manifest.entry, manifest.fingerprint), json.dumps(bad).encode())
    with pytest.raises(IntegrityError, match="conflicts"):
        fetch_artifact(memory_url, str(tmp_path / "d"), fingerprint=manifest.fingerprint)


def test_progress_goes_through_the_callback(memory_url, artifacts, tmp_path, capsys):
    from fsspec.callbacks import Callback

    class Recorder(Callback):
        def call(self, *args, **kwargs):
            seen.append(self.value)

    seen: list[int] = []
    art = artifacts()
    publish_artifacts([str(art)], memory_url, callback=Recorder())
    assert seen[-1] == Manifest.load(art).total_size
    seen.clear()
    fetch_artifact(memory_url, str(tmp_path / "d"), fingerprint=fingerprint_of(art), callback=Recorder())
    assert seen[-1] == Manifest.load(art).total_size
    assert capsys.readouterr() == ("", "")  # the library itself never prints; the CLI draws the bar
