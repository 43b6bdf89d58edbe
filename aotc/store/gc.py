"""gc: plan from a scan (no side effects), then ``execute``: manifests first, refs, objects last.

The lease protocol that keeps gc from deleting what a publish is about to reference is in leases.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aotc.errors import BadInput
from aotc.files import human_size
from aotc.store.core import ObjectInfo
from aotc.store.scan import DEFAULT_MIN_AGE, OBJECTS_KEPT, ManifestInfo, StoreInfo, StoreWarning, scan_manifests

if TYPE_CHECKING:
    from aotc.store.core import Store


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
    with store.lock("gc") as marker:
        now = store.server_time(marker)
        store.delete([m.path for m in plan.manifests_to_delete])
        for entry, fingerprint in plan.refs_to_rewrite:
            _rewrite_ref(store, entry, fingerprint)
        publishing = store.live_locks("publish", now, store.publish_lease_ttl)
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
