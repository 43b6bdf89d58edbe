import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs"
# `import torch_xla` in any test of this process appends its own XLA flags to os.environ; a JAX process, as a pod
# launches it, starts with the flags the suite was launched with.
LAUNCH_FLAGS = {var: os.environ.get(var, "") for var in ("XLA_FLAGS", "LIBTPU_INIT_ARGS")}


def launch_environ() -> dict[str, str]:
    """os.environ with the XLA flag variables as the suite was launched, whatever torch_xla added since."""
    return {**os.environ, **LAUNCH_FLAGS}


def run_aotc(*args: str, env: dict | None = None, cwd: str | Path | None = None, timeout: float = 600):
    """Run the real CLI in a subprocess, as a pod or a CI job would."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "aotc.cli", *map(str, args)], capture_output=True, text=True,
                          env=full_env, cwd=cwd or REPO, timeout=timeout)


@pytest.fixture(scope="session", autouse=True)
def isolated_default_store(tmp_path_factory):
    """Commands run from the repo resolve the store to .aotc/store there, or to a developer's $AOTC_STORE:
    either would seed the suite's builds and hand them whole entries. Tests name their stores."""
    from aotc.store import ENV_STORE

    os.environ[ENV_STORE] = str(tmp_path_factory.mktemp("default-store") / "store")


@pytest.fixture
def aotc_cli():
    return run_aotc


@pytest.fixture(scope="session")
def chromium():
    """A real headless Chromium (installed by apt on a fresh Debian machine, as CI's root)."""
    from tests.helpers.browser import ensure_chromium

    return ensure_chromium()


ANNOUNCED = "announced"


@pytest.fixture
def announce(request):
    """Figures and artifacts a person should look at (a screenshot, a canary's counts): printed at the end of
    the run under "announced", from whichever pytest-xdist worker ran the test."""
    def say(line: str) -> None:
        request.node.user_properties.append((ANNOUNCED, line))

    return say


def pytest_terminal_summary(terminalreporter):
    lines = [(report.nodeid, value) for report in terminalreporter.getreports("passed") + terminalreporter.getreports("failed")
             for key, value in getattr(report, "user_properties", ()) if key == ANNOUNCED and report.when == "call"]
    if lines:
        terminalreporter.section(ANNOUNCED)
        for nodeid, line in lines:
            terminalreporter.write_line(f"{nodeid}:\n{line}")
