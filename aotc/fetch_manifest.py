"""Which artifact a fetch takes: the manifest for an entry (its fingerprint computed for the pod, the KV block
count taken from the store when the pod cannot size it) or for a fingerprint, from the node cache when this
node fetched it before, else from the store; and, when none matches, what differs from the nearest one
published (the pod-mismatch report)."""

from __future__ import annotations

from typing import Any

from aotc.errors import BadInput, IntegrityError, NotFoundInStore
from aotc.files import parse_time
from aotc.manifest import Manifest
from aotc.store import Store, check_name
from aotc.store.cache import NodeCache


def cached_manifest(cache: NodeCache | None, entry: Any, fingerprint: str | None) -> Manifest | None:
    """A manifest this node fetched before: a store path is written once (create-only), so the copy is
    the store's manifest for that entry and fingerprint (verified when it was fetched)."""
    if cache is None:
        return None
    if entry is None:
        return cache.manifest_by_fingerprint(fingerprint) if fingerprint else None
    if fingerprint is None:
        from aotc.fingerprint import entry_kv_blocks, fingerprint_entry
        from aotc.kv import KvNotSized

        try:
            fingerprint = fingerprint_entry(entry, kv_blocks=entry_kv_blocks(entry, size=False)).digest
        except KvNotSized:
            return None  # the store says which KV block count was built (pod_fingerprint)
    return cache.manifest(entry.name, fingerprint)


def resolve_manifest(store: Store, entry: Any, fingerprint: str | None) -> tuple[Manifest, bytes]:
    if entry is not None and fingerprint is None:
        fp = pod_fingerprint(store, entry)
        try:
            return store.read_manifest(entry.name, fp.digest)
        except NotFoundInStore:
            raise NotFoundInStore(explain_missing(store, entry.name, fp.digest, fp.inputs)) from None
    if not fingerprint:
        raise BadInput("fetch needs an entry or a fingerprint")
    if entry is not None:
        return store.read_manifest(entry.name, fingerprint)
    return _by_fingerprint(store, fingerprint)


def pod_fingerprint(store: Store, entry: Any):
    """The fingerprint of the engine the pod runs. A KV block count its stack sizes on the pod's accelerator is
    not sized in an init container (neither the stack nor the accelerator is there): fetch takes the one the
    newest build of this entry, equal in every other input (else the newest at all, so that a miss names the
    inputs that differ, not the count), sized and published; the server pins that count and the guard names
    a server whose count differs."""
    from aotc.fingerprint import entry_kv_blocks, fingerprint_entry, fingerprint_inputs
    from aotc.kv import KvNotSized

    try:
        return fingerprint_entry(entry, kv_blocks=entry_kv_blocks(entry, size=False))
    except KvNotSized:
        pass
    unsized = fingerprint_inputs(entry, kv_blocks=None)
    found, _ = store.load_manifests(sorted(store.find(f"manifests/{check_name(entry.name, 'entry name')}")))
    published = [m for _, m, _ in found]
    built = [m for m in published if {**m.inputs, "kv_blocks": None} == unsized] or published
    sized = max(built, key=lambda m: parse_time(m.created)).inputs.get("kv_blocks") if built else None
    return fingerprint_entry(entry, kv_blocks=sized)


def _by_fingerprint(store: Store, fingerprint: str) -> tuple[Manifest, bytes]:
    try:
        check_name(fingerprint, "fingerprint")
    except IntegrityError as exc:
        raise BadInput(str(exc)) from exc
    paths = [p for p in store.find("manifests") if p.endswith(f"/{fingerprint}.json")]
    found, damaged = store.load_manifests(paths)
    if damaged and not found:
        raise IntegrityError(damaged[0][1])
    if not found:
        store.require()
        raise NotFoundInStore(f"no artifact with fingerprint {fingerprint} in {store.url}")
    _, manifest, data = max(found, key=lambda found: parse_time(found[1].created))
    return manifest, data


def explain_missing(store: Store, entry: str, digest: str, inputs: dict[str, Any]) -> str:
    """Name the inputs that differ from the nearest published manifest (fewest keys, newest on ties)."""
    head = f"no artifact for entry {entry} with fingerprint {digest[:16]} in {store.url}"
    found, _ = store.load_manifests(sorted(store.find(f"manifests/{check_name(entry, 'entry name')}")))
    published = [m for _, m, _ in found]
    if not published:
        return f"{head}: nothing is published for this entry"
    from aotc.fingerprint import describe_diff, diff_inputs

    diffs = [(diff_inputs(inputs, m.inputs), m) for m in published]
    keys, nearest = min(diffs, key=lambda d: (len(d[0]), -parse_time(d[1].created)))
    shown = "; ".join(describe_diff(inputs, nearest.inputs)[:8])
    more = f" (+{len(keys) - 8} more)" if len(keys) > 8 else ""
    return (f"{head}; the nearest published one, {nearest.fingerprint[:16]} ({nearest.created}), "
            f"differs in {len(keys)} input(s): {shown or 'none (the fingerprint scheme changed?)'}{more}")
