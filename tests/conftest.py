import fcntl
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

# what the support table's tests measured, recorded when $AOTC_SUPPORT_RECORDS is set (docs/support.md)
from tests.helpers.support_records import pytest_runtest_makereport, saw  # noqa: F401

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs"
# `import torch_xla` in any test of this process appends its own XLA flags to os.environ; a JAX process, as a pod
# launches it, starts with the flags the suite was launched with.
LAUNCH_FLAGS = {var: os.environ.get(var, "") for var in ("XLA_FLAGS", "LIBTPU_INIT_ARGS")}
# Tests that drive the tpu-inference runner's JAX venv (`make env-jax`): every test under these directories.
NEEDS_JAX_DIRS = (Path(__file__).resolve().parent / "tpu_inference",)


def launch_environ() -> dict[str, str]:
    """os.environ with the XLA flag variables as the suite was launched, whatever torch_xla added since."""
    return {**os.environ, **LAUNCH_FLAGS}


def run_aotc(*args: str, env: dict | None = None, cwd: str | Path | None = None, timeout: float = 600):
    """Run the real CLI in a subprocess, as a pod or a CI job would."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "aotc.cli", *map(str, args)], capture_output=True, text=True,
                          env=full_env, cwd=cwd or REPO, timeout=timeout)
    saw(args, proc.stdout)
    return proc


@pytest.fixture(scope="session", autouse=True)
def isolated_default_store(tmp_path_factory):
    """Commands run from the repo resolve the store to .aotc/store there, or to a developer's $AOTC_STORE:
    either would seed the suite's builds and hand them whole entries. Tests name their stores."""
    from aotc.store import ENV_STORE

    os.environ[ENV_STORE] = str(tmp_path_factory.mktemp("default-store") / "store")


@pytest.fixture
def aotc_cli():
    return run_aotc


@contextmanager
def shared_across_workers(tmp_path_factory, name: str) -> Iterator[Path]:
    """A directory this run's pytest-xdist workers all see (under the run's basetemp, which each worker's
    sits in), held under an exclusive lock: the first worker makes what it holds, the others wait and read."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    directory = root / name
    directory.mkdir(exist_ok=True)
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield directory


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


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the marker must be on the item by then
def pytest_collection_modifyitems(items):
    """`make test-fast` runs on the core venv alone (`make env`): a test that needs the JAX venv is marked
    `needs_jax` by where it lives, so that tier leaves it out; `make test` runs it and it never skips."""
    for item in items:
        if in_needs_jax_dir(Path(item.path)):
            item.add_marker(pytest.mark.needs_jax)


def pytest_configure(config):
    config.pluginmanager.register(CostliestModulesFirst(), "aotc-costliest-modules-first")


class CostliestModulesFirst:
    """Modules in the order pytest-xdist hands them to the workers (`make test` passes --no-loadscope-reorder):
    those with the most slow tests first, each still whole. A worker asks for the next module when it is almost
    through its own, so the run ends on short modules and neither worker waits long at the end for the other's
    last engine. (xdist's own order, most tests first, put the few-test modules that each build an entry or start
    a server last.) A module's tests keep their order."""

    @pytest.hookimpl(trylast=True)  # after pytest has grouped the tests of each module-scoped fixture parameter
    def pytest_collection_modifyitems(self, items):
        slow: Counter[str] = Counter()
        tests: Counter[str] = Counter()
        for item in items:
            tests[module_of(item)] += 1
            slow[module_of(item)] += item.get_closest_marker("slow") is not None
        rank = {module: n for n, module in enumerate(sorted(tests, key=lambda m: (-slow[m], -tests[m])))}
        items.sort(key=lambda item: rank[module_of(item)])


def module_of(item) -> str:
    return item.nodeid.split("::")[0]


def pytest_ignore_collect(collection_path, config):
    """A `needs_jax` directory that `-m` leaves out is not even imported: its modules read the JAX venv's
    stack at import (a matrix checked against vLLM 0.32, a plan), which fails where that venv is missing."""
    if collection_path in NEEDS_JAX_DIRS and not may_select(config.option.markexpr, "needs_jax"):
        return True
    return None


def in_needs_jax_dir(path: Path) -> bool:
    return any(path.is_relative_to(directory) for directory in NEEDS_JAX_DIRS)


def may_select(markexpr: str, marker: str) -> bool:
    """Whether the `-m` expression selects some test that carries ``marker``, whatever its other markers."""
    if not markexpr:
        return True
    from itertools import combinations

    from _pytest.mark.expression import Expression  # what `-m` itself evaluates

    expr = Expression.compile(markexpr)
    others = sorted(expr.idents() - {marker})
    return any(expr.evaluate(lambda name, **_: name == marker or name in chosen)
               for size in range(len(others) + 1) for chosen in combinations(others, size))
