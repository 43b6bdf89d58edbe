"""The artifact manifest (schema 1, docs/design.md) and the path rules every reader enforces."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from aotc.errors import BadInput, IntegrityError
from aotc.files import replace_file

SCHEMA = 1
MAX_FILE_SIZE = (1 << 63) - 1  # what a filesystem's off_t holds
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # how JSON spells a surrogate (paired or not)
MANIFEST_NAME = "manifest.json"
CACHE_DIR_NAME = "cache"
STARTUP, RUNTIME = "startup", "runtime"  # the graph families beyond the plan (docs/design.md)


def check_relative_path(path: str) -> str:
    """Return ``path`` if it is a plain relative POSIX path, else raise IntegrityError.

    Manifests come from a store other people write to: a path is never allowed to leave
    the destination directory, however it is spelled.
    """
    if not path or "\\" in path or "\x00" in path:
        raise IntegrityError(f"unsafe path in manifest: {path!r}")
    pure = PurePosixPath(path)
    if pure.is_absolute() or any(part in ("..", ".", "") for part in path.split("/")):
        raise IntegrityError(f"unsafe path in manifest: {path!r}")
    return path


@dataclass(frozen=True)
class FileRecord:
    path: str
    sha256: str
    size: int


@dataclass(frozen=True)
class GraphRecord:
    family: str
    shape: dict[str, Any]
    keys: tuple[str, ...] = ()
    compile_seconds: float = 0.0
    beyond_warmup: bool = False  # the stack's warm-up skips it; aotc compiled it (GraphSpec.beyond_warmup)
    compiled: dict[str, int] = field(default_factory=dict)  # a TPU target's compiler figures (protocol.Graph)

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "shape": dict(self.shape), "keys": list(self.keys),
                "compile_seconds": round(self.compile_seconds, 4),
                **({"beyond_warmup": True} if self.beyond_warmup else {}),
                **({"compiled": dict(self.compiled)} if self.compiled else {})}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GraphRecord:
        return cls(family=data["family"], shape=dict(data.get("shape", {})),
                   keys=tuple(data.get("keys", ())),
                   compile_seconds=float(data.get("compile_seconds", 0.0)),
                   beyond_warmup=bool(data.get("beyond_warmup", False)),
                   compiled={str(k): int(v) for k, v in (data.get("compiled") or {}).items()})


VERIFY_UNPROVEN = "verify_unproven"


@dataclass(frozen=True)
class VerifySummary:
    misses: int = 0
    replayed_graphs: int = 0
    traffic_requests: int = 0
    loadable: bool = False


@dataclass(frozen=True)
class Manifest:
    entry: str
    fingerprint: str
    inputs: dict[str, Any]
    created: str
    aotc_version: str
    runner: str
    device: str
    files: tuple[FileRecord, ...] = ()
    graphs: tuple[GraphRecord, ...] = ()
    verify: VerifySummary | None = None
    schema: int = SCHEMA
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def verify_unproven(self) -> str | None:
        """Why the host that verified could not show a load at all (a top-level key: readers of the four
        ``verify`` keys stay as they are)."""
        return self.extra.get(VERIFY_UNPROVEN)

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "schema": self.schema, "entry": self.entry, "fingerprint": self.fingerprint,
            "inputs": self.inputs, "created": self.created, "aotc_version": self.aotc_version,
            "runner": self.runner, "device": self.device,
            "files": [asdict(f) for f in self.files],
            "graphs": [g.to_dict() for g in self.graphs],
            "verify": asdict(self.verify) if self.verify else None,
        }
        data.update(self.extra)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise IntegrityError(f"unsupported manifest schema: {data.get('schema') if isinstance(data, dict) else data!r}")
        known = {"schema", "entry", "fingerprint", "inputs", "created", "aotc_version", "runner",
                 "device", "files", "graphs", "verify"}
        try:
            files = tuple(
                FileRecord(path=check_relative_path(f["path"]), sha256=str(f["sha256"]), size=_byte_count(f["size"]))
                for f in data["files"]
            )
            verify = data.get("verify")
            return cls(
                entry=str(data["entry"]), fingerprint=str(data["fingerprint"]),
                inputs=dict(data.get("inputs", {})), created=str(data.get("created", "")),
                aotc_version=str(data.get("aotc_version", "")), runner=str(data.get("runner", "")),
                device=str(data.get("device", "")), files=files,
                graphs=tuple(GraphRecord.from_dict(g) for g in data.get("graphs", ())),
                verify=VerifySummary(**verify) if verify else None,
                extra={k: v for k, v in data.items() if k not in known},
            )
        except (KeyError, TypeError, ValueError, RecursionError) as exc:
            raise IntegrityError(f"malformed manifest: {exc}") from exc

    @staticmethod
    def decode(text: str | bytes) -> Any:
        """JSON from a store other people write to: any way it fails to parse is an IntegrityError
        (bad UTF-8, a number too long for int, nesting too deep for the parser, a lone surrogate)."""
        try:
            data = json.loads(text)
        except RecursionError as exc:
            raise IntegrityError("manifest is not valid JSON: nested too deeply") from exc
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, int digit limit
            raise IntegrityError(f"manifest is not valid JSON: {exc}") from exc
        if _SURROGATE_ESCAPE.search(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")):
            _check_unicode(data)
        return data

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        return cls.from_dict(cls.decode(text))

    @classmethod
    def load(cls, artifact_dir: str | Path) -> Manifest:
        path = Path(artifact_dir) / MANIFEST_NAME
        if not path.is_file():
            raise BadInput(f"{artifact_dir}: not an artifact directory (no {MANIFEST_NAME})")
        return cls.from_json(path.read_bytes())

    def save(self, artifact_dir: str | Path) -> Path:
        """Write manifest.json atomically (aotc/files.py: replace_file), so a reader never sees half of it."""
        return replace_file(Path(artifact_dir) / MANIFEST_NAME, self.to_json().encode())


def _byte_count(value: Any) -> int:
    """A file size as the manifest states it: a JSON integer in 0..2**63-1 (1e400 and 10**400 are not)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_FILE_SIZE:
        shown = repr(value) if not isinstance(value, int) or value.bit_length() < 128 else "a huge number"
        raise IntegrityError(f"malformed manifest: size {shown[:40]} is not a byte count")
    return value


def _check_unicode(data: Any) -> None:
    """Every string encodes as UTF-8: a lone surrogate (valid JSON, not text) cannot be written anywhere."""
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise IntegrityError("manifest is not valid JSON text: a string holds a lone surrogate") from exc
