"""Scan, plan, execute (as huggingface_hub's cache manager): a scan of the whole store as frozen records
(damage becomes typed warnings, never an exception), a gc plan from a scan with no side effects, and
``GcStrategy.execute``: manifests first, refs, objects last. The lease protocol that keeps gc from deleting
what a publish is about to reference is in leases.py."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aotc.errors import BadInput
from aotc.files import checked_time, human_size, parse_time
from aotc.store import layout
from aotc.store.core import ObjectInfo
from aotc.store.leases import hold, live_leases, server_time

if TYPE_CHECKING:
    from aotc.manifest import Manifest
    from aotc.store.core import Store

DEFAULT_MIN_AGE = 3600.0  # gc never deletes a blob younger than this (defence in depth)

# StoreWarning kinds
STRAY_OBJECT = "stray_object"  # a file under objects/ that is not <2 hex>/<sha256>
DAMAGED_MANIFEST = "damaged_manifest"  # does not parse or verify: what it references is unknown
MISSING_OBJECTS = "missing_objects"  # a manifest names objects the store does not hold
DANGLING_REF = "dangling_ref"  # a ref names a fingerprint with no manifest
OBJECTS_KEPT = "objects_kept"  # gc keeps every object while a manifest is damaged


@dataclass(frozen=True)
class StoreWarning:
    kind: str
    url: str  # what it is about
    message: str

    def __str__(self) -> str:
        return f"{self.url}: {self.message}" if self.url else self.message

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "url": self.url, "message": self.message}


@dataclass(frozen=True)
class ManifestInfo:
    entry: str
    fingerprint: str
    created: str
    path: str
    file_count: int
    size: int
    objects: frozenset[str]
    missing_objects: int = 0

    @property
    def created_ts(self) -> float:
        return parse_time(self.created)

    @property
    def size_str(self) -> str:
        return human_size(self.size)

    def to_dict(self) -> dict[str, Any]:
        return {"entry": self.entry, "fingerprint": self.fingerprint, "created": self.created,
                "path": self.path, "files": self.file_count, "size": self.size,
                "objects": len(self.objects), "missing_objects": self.missing_objects}


@dataclass(frozen=True)
class EntryInfo:
    name: str
    manifests: tuple[ManifestInfo, ...]  # newest first
    ref: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ref": self.ref, "manifests": [m.to_dict() for m in self.manifests]}


@dataclass(frozen=True)
class StoreInfo:
    url: str
    entries: tuple[EntryInfo, ...]
    objects: tuple[ObjectInfo, ...]
    temp_files: tuple[tuple[str, float | None], ...]
    warnings: tuple[StoreWarning, ...]
    damaged: tuple[str, ...] = ()  # manifests that do not parse: what they reference is unknown
    scanned_at: float = field(default_factory=time.time)

    @property
    def size_on_store(self) -> int:
        return sum(o.size for o in self.objects)

    @property
    def size_on_store_str(self) -> str:
        return human_size(self.size_on_store)

    @property
    def referenced(self) -> frozenset[str]:
        return frozenset().union(*(m.objects for e in self.entries for m in e.manifests))

    def to_dict(self) -> dict[str, Any]:
        referenced = self.referenced
        return {"store": self.url, "entries": [e.to_dict() for e in self.entries],
                "objects": len(self.objects), "size_on_store": self.size_on_store,
                "unreferenced_objects": sum(o.sha256 not in referenced for o in self.objects),
                "warnings": [w.to_dict() for w in self.warnings]}

    def gc(self, keep: int = 2, min_age: float = DEFAULT_MIN_AGE) -> GcStrategy:
        return plan_gc(self, keep, min_age)


def scan_store(store: Store) -> StoreInfo:
    store.require()
    warnings: list[StoreWarning] = []
    objects, strays = store.list_objects()
    temp_files = []
    for path, mtime in strays.items():
        if layout.is_temp_name(path):
            temp_files.append((path, mtime))
        else:
            warnings.append(StoreWarning(STRAY_OBJECT, store.url_of(path), "not a content-addressed object name"))
    manifests, manifest_warnings, damaged = scan_manifests(store, objects)
    warnings += manifest_warnings
    entries = []
    for name in sorted({m.entry for m in manifests} | set(_ref_names(store))):
        mine = sorted((m for m in manifests if m.entry == name),
                      key=lambda m: (m.created_ts, m.fingerprint), reverse=True)
        ref = store.read_ref(name)
        ref_fp = ref.get("fingerprint") if ref else None
        if ref_fp and ref_fp not in {m.fingerprint for m in mine}:
            warnings.append(StoreWarning(DANGLING_REF, store.url_of(store.ref_path(name)),
                                         f"names {ref_fp}, which has no manifest"))
        entries.append(EntryInfo(name, tuple(mine), ref_fp))
    return StoreInfo(store.url, tuple(entries), tuple(sorted(objects.values(), key=lambda o: o.sha256)),
                     tuple(temp_files), tuple(warnings), tuple(damaged))


def _ref_names(store: Store) -> list[str]:
    names = []
    for path in store.find(layout.REFS):
        rel = store.relative(path, layout.REFS) or ""
        if rel.endswith(".json") and "/" not in rel:
            try:
                names.append(layout.check_name(rel[: -len(".json")], "entry name"))
            except ValueError:
                continue
    return names


def scan_manifests(store: Store, objects: dict[str, ObjectInfo]
                   ) -> tuple[list[ManifestInfo], list[StoreWarning], list[str]]:
    """(manifests, warnings, damaged paths): a damaged manifest is a warning, only I/O failures raise."""
    found, damaged = store.load_manifests(sorted(store.find(layout.MANIFESTS)))
    odd = {path: reason for path, manifest, _ in found if (reason := odd_field(manifest))}
    damaged += odd.items()
    warnings = [StoreWarning(DAMAGED_MANIFEST, store.url_of(path), _strip(reason, store.url_of(path)))
                for path, reason in damaged]
    out = []
    for path, manifest, _ in found:
        if path in odd:
            continue
        shas = frozenset(f.sha256 for f in manifest.files)
        missing = sum(1 for s in shas if s not in objects)
        if missing:
            warnings.append(StoreWarning(MISSING_OBJECTS, store.url_of(path),
                                         f"{missing} referenced object(s) missing from the store"))
        out.append(ManifestInfo(manifest.entry, manifest.fingerprint, manifest.created, path,
                                len(manifest.files), manifest.total_size, shas, missing))
    return out, warnings, [path for path, _ in damaged]


def odd_field(manifest: Manifest) -> str | None:
    """Why a manifest that parsed cannot be listed as it is, or None. Its files' sizes and every string
    were checked by the parser; what is left is ``created``, which listings show and sort by."""
    if checked_time(manifest.created) is None:
        return f"created {manifest.created[:40]!r} is not an ISO-8601 time within years 1-9999"
    return None


def _strip(reason: str, url: str) -> str:
    """Messages from the parser start with the URL; the record keeps it in its own field."""
    return reason[len(url) + 2:] if reason.startswith(f"{url}: ") else reason


@dataclass(frozen=True)
class GcReport:
    deleted_manifests: int = 0
    deleted_objects: int = 0
    deleted_temp_files: int = 0
    freed_size: int = 0
    spared_referenced: int = 0  # became referenced between plan and delete
    deferred_objects: int = 0  # a publish was in flight, or a manifest is unreadable
    deferred_by: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"deleted_manifests": self.deleted_manifests, "deleted_objects": self.deleted_objects,
                "deleted_temp_files": self.deleted_temp_files, "freed_size": self.freed_size,
                "spared_referenced": self.spared_referenced, "deferred_objects": self.deferred_objects,
                "deferred_by": list(self.deferred_by)}


@dataclass(frozen=True)
class GcStrategy:
    """What gc would delete; ``execute`` is the only method with side effects."""

    keep: int
    min_age: float
    manifests_to_delete: tuple[ManifestInfo, ...]
    objects_to_delete: tuple[ObjectInfo, ...]
    objects_too_new: tuple[ObjectInfo, ...]
    temp_files_to_delete: tuple[str, ...]
    refs_to_rewrite: tuple[tuple[str, str | None], ...]  # (entry, newest kept fingerprint or None)
    warnings: tuple[StoreWarning, ...] = ()

    @property
    def expected_freed_size(self) -> int:
        return sum(o.size for o in self.objects_to_delete)

    @property
    def expected_freed_size_str(self) -> str:
        return human_size(self.expected_freed_size)

    def to_dict(self) -> dict[str, Any]:
        return {"keep": self.keep, "min_age_seconds": self.min_age,
                "expected_freed_size": self.expected_freed_size,
                "manifests_to_delete": [m.to_dict() for m in self.manifests_to_delete],
                "objects_to_delete": [o.sha256 for o in self.objects_to_delete],
                "objects_too_new": len(self.objects_too_new),
                "temp_files_to_delete": list(self.temp_files_to_delete),
                "refs_to_rewrite": {e: fp for e, fp in self.refs_to_rewrite},
                "warnings": [w.to_dict() for w in self.warnings]}

    def execute(self, store: Store) -> GcReport:
        return _execute_gc(self, store)


def plan_gc(info: StoreInfo, keep: int, min_age: float = DEFAULT_MIN_AGE) -> GcStrategy:
    if keep < 0:
        raise BadInput(f"gc --keep must be >= 0, got {keep}")
    doomed: list[ManifestInfo] = []
    refs: list[tuple[str, str | None]] = []
    kept_objects: set[str] = set()
    for entry in info.entries:
        kept, dropped = entry.manifests[:keep], entry.manifests[keep:]
        doomed.extend(dropped)
        kept_objects.update(*(m.objects for m in kept))
        newest = kept[0].fingerprint if kept else None
        if entry.ref != newest:
            refs.append((entry.name, newest))
    old_enough = lambda mtime: mtime is not None and info.scanned_at - mtime >= min_age  # noqa: E731
    unreferenced = [o for o in info.objects if o.sha256 not in kept_objects]
    warnings = info.warnings
    if info.damaged:  # they might name any object: delete none until someone repairs or removes them
        warnings += (StoreWarning(OBJECTS_KEPT, info.url, f"gc deletes no objects while {len(info.damaged)} "
                                                          "manifest(s) are unreadable"),)
        unreferenced = []
    return GcStrategy(
        keep=keep, min_age=min_age, manifests_to_delete=tuple(doomed),
        objects_to_delete=tuple(o for o in unreferenced if old_enough(o.mtime)),
        objects_too_new=tuple(o for o in unreferenced if not old_enough(o.mtime)),
        temp_files_to_delete=tuple(p for p, mtime in info.temp_files if old_enough(mtime)),
        refs_to_rewrite=tuple(refs), warnings=warnings)


def _execute_gc(plan: GcStrategy, store: Store) -> GcReport:
    """Manifests first (a fetch then finds nothing rather than half), refs, then objects last."""
    with hold(store, "gc") as marker:
        now = server_time(store, marker)
        store.delete([m.path for m in plan.manifests_to_delete])
        for entry, fingerprint in plan.refs_to_rewrite:
            _rewrite_ref(store, entry, fingerprint)
        publishing = [lease.path for lease in live_leases(store, "publish", now, store.publish_lease_ttl)]
        if publishing:
            return GcReport(deleted_manifests=len(plan.manifests_to_delete),
                            deferred_objects=len(plan.objects_to_delete), deferred_by=tuple(publishing))
        current, _ = store.list_objects()
        manifests, _, damaged = scan_manifests(store, current)
        if damaged:
            return GcReport(deleted_manifests=len(plan.manifests_to_delete),
                            deferred_objects=len(plan.objects_to_delete), deferred_by=tuple(damaged))
        referenced = set().union(*(m.objects for m in manifests))
        doomed = [o for o in plan.objects_to_delete
                  if o.sha256 not in referenced and _still_old(current.get(o.sha256), now, plan.min_age)]
        store.delete([store.object_path(o.sha256) for o in doomed] + list(plan.temp_files_to_delete))
        return GcReport(deleted_manifests=len(plan.manifests_to_delete), deleted_objects=len(doomed),
                        deleted_temp_files=len(plan.temp_files_to_delete),
                        freed_size=sum(o.size for o in doomed),
                        spared_referenced=sum(o.sha256 in referenced for o in plan.objects_to_delete))


def _still_old(obj: ObjectInfo | None, now: float, min_age: float) -> bool:
    return obj is not None and obj.mtime is not None and now - obj.mtime >= min_age


def _rewrite_ref(store: Store, entry: str, fingerprint: str | None) -> None:
    if fingerprint is None:
        store.delete([store.ref_path(entry)])
        return
    manifest, _ = store.read_manifest(entry, fingerprint)
    store.write_ref(manifest)
