"""Error types and the exit codes they map to (docs/design.md, "Exit codes").

Each error subclasses the built-in that best describes it, so library callers can catch
``ValueError`` / ``FileNotFoundError`` without knowing aotc; the CLI maps them to exit codes in one place.
"""

from __future__ import annotations

EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_NOT_FOUND = 3
EXIT_INTEGRITY = 4


class AotcError(Exception):
    exit_code = EXIT_CHECK_FAILED


class CheckFailed(AotcError):
    """A check ran and said no: verify found misses, a build step failed."""

    exit_code = EXIT_CHECK_FAILED


class BadInput(AotcError, ValueError):
    exit_code = EXIT_BAD_INPUT


class MatrixError(BadInput):
    """A matrix YAML is invalid; the message names the file, the key path and the reason."""

    def __init__(self, file: str, key_path: str, reason: str):
        self.file, self.key_path, self.reason = file, key_path, reason
        where = f"{file}: {key_path}" if key_path else file
        super().__init__(f"{where}: {reason}")


class NotFoundInStore(AotcError, FileNotFoundError):
    exit_code = EXIT_NOT_FOUND


class DeadlineExceeded(NotFoundInStore):
    """The store did not deliver in time: for a pod, the same as nothing being published (exit 3)."""


class IntegrityError(AotcError, OSError):
    """Checksum mismatch, truncated object, unsafe path in a manifest."""

    exit_code = EXIT_INTEGRITY
