"""Where things live in a store (docs/design.md "Store layout"): keys relative to the store root.

    objects/sha256/<2 hex>/<sha256>        immutable blobs shared by every entry
    manifests/<entry>/<fingerprint>.json   written last, create-only: its presence means complete
    refs/<entry>.json                      the newest fingerprint per entry (advisory)
    locks/<kind>-<id>.json                 leases (publish, gc)
"""

from __future__ import annotations

import re
import uuid

from aotc.errors import IntegrityError
from aotc.files import PLAIN_NAME

SHA256_HEX = re.compile(r"[0-9a-f]{64}")
OBJECTS, MANIFESTS, REFS, LOCKS = "objects/sha256", "manifests", "refs", "locks"
_NAME = PLAIN_NAME


def check_name(value: str, what: str) -> str:
    """Entry names and fingerprints become store path components: one plain segment each."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise IntegrityError(f"unsafe {what} for a store path: {value!r}")
    return value


def object_key(sha256: str) -> str:
    return f"{OBJECTS}/{sha256[:2]}/{sha256}"


def split_object_key(rel: str) -> str | None:
    """The sha256 of a well-formed object key under ``objects/sha256/``, else None."""
    two, _, sha = rel.partition("/")
    return sha if SHA256_HEX.fullmatch(sha) and sha[:2] == two else None


def manifest_key(entry: str, fingerprint: str) -> str:
    return f"{MANIFESTS}/{check_name(entry, 'entry name')}/{check_name(fingerprint, 'fingerprint')}.json"


def split_manifest_key(rel: str) -> tuple[str, str] | None:
    """(entry, fingerprint) of a key under ``manifests/``, or None when it is not one."""
    parts = rel.split("/")
    if len(parts) != 2 or not parts[1].endswith(".json"):
        return None
    return parts[0], parts[1][: -len(".json")]


def ref_key(entry: str) -> str:
    return f"{REFS}/{check_name(entry, 'entry name')}.json"


def lock_key(kind: str) -> str:
    return f"{LOCKS}/{kind}-{uuid.uuid4().hex}.json"


def is_temp_name(path: str) -> bool:
    """Hidden siblings a local-folder write goes through (see writes.py); readers ignore them."""
    return ".tmp-" in path.rsplit("/", 1)[-1]
