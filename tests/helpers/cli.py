"""What every CLI test asserts of a finished ``aotc`` process: a result on stdout, or one line on stderr."""

from __future__ import annotations

import json
import subprocess
from typing import Any


def json_output(proc: subprocess.CompletedProcess) -> Any:
    """The ``--json`` document of a command that succeeded."""
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def one_line_error(proc: subprocess.CompletedProcess, code: int) -> str:
    """The one stderr line of a command that failed with ``code`` (bad input is never a traceback)."""
    assert proc.returncode == code, (proc.returncode, proc.stderr[-3000:])
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.stderr
