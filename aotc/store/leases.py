"""Leases between publishers and gc, kept as small files under ``locks/``.

A publisher may list the objects, find a blob it needs already there, and write a manifest that
references it minutes later; the blobs it uploads are unreferenced until then. So gc (1) plans from a
scan, (2) writes its own ``locks/gc-*`` lease, (3) deletes the planned manifests, (4) lists
``locks/publish-*`` and, if a live one exists, keeps every object (deferred to the next run), (5)
otherwise re-reads all manifests and deletes only objects that are still unreferenced and older than
``min_age``. A publisher writes its lease before it lists gc leases, and waits while a live gc lease
exists. Both sides write and then read, so with a strongly consistent listing (GCS, a local folder) at
least one sees the other: either gc defers, or the publisher lists the objects after gc finished.

A killed gc leaves its lease behind; publishers wait for it to expire (``GC_LOCK_TTL``) and say so at
warning level with its age. ``aotc break-lease`` removes it at once (``break_leases``) when it can tell the
holder is gone: a pid on this host that no longer runs, else an age past the TTL (``--force`` overrides).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from aotc.files import pid_namespace, process_state
from aotc.store import layout
from aotc.store.core import info_mtime

if TYPE_CHECKING:
    from aotc.store.core import Store

KINDS = ("publish", "gc")
WARN_AFTER = 5.0  # a gc usually finishes within seconds: warn once a publish has waited this long...
WARN_OLD = 60.0  # ...or at once when the lease is already this old
WARN_EVERY = 30.0  # seconds between repeated "still waiting" warnings
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Lease:
    path: str
    url: str
    kind: str
    age: float | None  # seconds, by the store's clock; None when the backend gives no time
    holder: dict[str, Any]  # what the lease file says: pid, host, started (may be empty if unreadable)

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "kind": self.kind,
                "age_seconds": None if self.age is None else round(self.age, 1), "holder": self.holder}


@contextmanager
def hold(store: Store, kind: str) -> Iterator[str]:
    path = store.path(layout.lock_key(kind))
    body = {"kind": kind, "pid": os.getpid(), "host": os.uname().nodename, "pidns": pid_namespace(),
            "started": datetime.now(timezone.utc).isoformat()}
    store.replace(path, json.dumps(body).encode())
    try:
        yield path
    finally:
        try:
            store.fs.rm_file(path)
        except FileNotFoundError:
            pass


def server_time(store: Store, path: str) -> float:
    """The store's clock, read from a file we just wrote, so lease ages ignore client skew."""
    try:
        return info_mtime(store.fs.info(path)) or time.time()
    except FileNotFoundError:
        return time.time()


def list_leases(store: Store, kind: str | None, now: float) -> list[Lease]:
    leases = []
    for path, info in store.find(layout.LOCKS).items():
        name = path.rsplit("/", 1)[-1]
        found = next((k for k in KINDS if name.startswith(f"{k}-")), None)
        if found is None or (kind and found != kind):
            continue
        mtime = info_mtime(info)
        leases.append(Lease(path, store.url_of(path), found, None if mtime is None else now - mtime,
                            _holder(store, path)))
    return leases


def _holder(store: Store, path: str) -> dict[str, Any]:
    try:
        body = json.loads(store.read_small(path))
    except (OSError, ValueError, RecursionError):
        return {}
    return body if isinstance(body, dict) else {}


def live_leases(store: Store, kind: str, now: float, ttl: float, mine: str | None = None) -> list[Lease]:
    return [lease for lease in list_leases(store, kind, now)
            if lease.path != mine and (lease.age is None or lease.age < ttl)]


def wait_for_gc(store: Store, lease: str, poll: float = 0.5) -> None:
    """A publisher must not list objects while a gc is deleting them (a dead gc's lease expires)."""
    written, started = server_time(store, lease), time.monotonic()
    warned: float | None = None
    while True:
        waited = time.monotonic() - started
        live = live_leases(store, "gc", written + waited, store.gc_lock_ttl)
        if not live:
            return
        oldest = max(live, key=lambda lease: lease.age or 0.0)
        if warned is None:
            due = waited >= WARN_AFTER or (oldest.age or 0.0) >= WARN_OLD
        else:
            due = waited - warned >= WARN_EVERY
        if due:
            warned = waited
            logger.warning("publish waits for the gc lease %s (age %.0fs, held by %s); a gc killed mid-run "
                           "blocks publishes until its lease is %.0fs old; if no gc is running, remove it "
                           "with: aotc break-lease --store %s", oldest.url, oldest.age or 0.0,
                           _who(oldest.holder), store.gc_lock_ttl, store.url)
        time.sleep(poll)


def _who(holder: dict[str, Any]) -> str:
    return f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}" if holder else "an unknown process"


@dataclass(frozen=True)
class BreakDecision:
    """What ``break-lease`` did with one lease and what it checked to decide."""

    lease: Lease
    removed: bool
    checked: str

    def to_dict(self) -> dict[str, Any]:
        return self.lease.to_dict() | {"removed": self.removed, "checked": self.checked}


def break_leases(store: Store, kind: str = "gc", older_than: float = 0.0, force: bool = False) -> list[BreakDecision]:
    """Delete the ``kind`` leases at least ``older_than`` seconds old whose holder is known to be gone.

    A live gc whose lease is broken may delete objects a publisher is about to reference, so a lease is
    removed only when its holder ran on this host (and pid namespace) and is no longer running, or, when
    that cannot be checked from here, when it is older than the kind's TTL; ``force`` skips the checks."""
    marker = store.path(layout.lock_key("probe"))
    store.replace(marker, b"{}")
    try:
        now = server_time(store, marker)
    finally:
        store.delete([marker])
    ttl = store.gc_lock_ttl if kind == "gc" else store.publish_lease_ttl
    decisions = [_decide(lease, ttl, force) for lease in list_leases(store, kind, now)
                 if lease.age is None or lease.age >= older_than]
    store.delete([d.lease.path for d in decisions if d.removed])
    return decisions


def _decide(lease: Lease, ttl: float, force: bool) -> BreakDecision:
    if force:
        return BreakDecision(lease, True, "--force: nothing checked")
    pid = lease.holder.get("pid")
    if _checkable_here(lease.holder) and isinstance(pid, int) and not isinstance(pid, bool) and pid > 0:
        state = process_state(pid)
        if state is not None and state not in "ZX":
            return BreakDecision(lease, False, f"its holder, pid {pid} on this host, is running")
        return BreakDecision(lease, True, f"its holder, pid {pid} on this host, is not running")
    who = f"its holder ({_who(lease.holder)}) cannot be checked from here"
    if lease.age is None:
        return BreakDecision(lease, False, f"its age is unknown and {who}")
    if lease.age < ttl:
        return BreakDecision(lease, False, f"it is {lease.age:.0f} s old, younger than the {lease.kind} lease TTL "
                                           f"({ttl:.0f} s), and {who}")
    return BreakDecision(lease, True, f"it is {lease.age:.0f} s old, past the {lease.kind} lease TTL ({ttl:.0f} s)")


def _checkable_here(holder: dict[str, Any]) -> bool:
    """The holder's pid means a process this one can see: same host, and same pid namespace if recorded."""
    if holder.get("host") != os.uname().nodename:
        return False
    return holder.get("pidns") in (None, pid_namespace())
