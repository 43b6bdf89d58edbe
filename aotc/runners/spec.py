"""The runner interface: all the core knows of a backend, found by name through the entry-point group
``aotc.runners`` (the way fsspec finds a filesystem by protocol). A backend is one package that exposes a
``RunnerSpec`` and registers it; no core module names a runner. See docs/design.md, "Runner interface".

Everything here is import-light: a backend's hooks import its stack inside themselves, on first use.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aotc.errors import BadInput
from aotc.runners.paddings import full_length_blocks

if TYPE_CHECKING:  # data types below the interface; entry.py resolves an entry's runner here at run time
    from aotc.entry import Entry
    from aotc.graphs import GraphSpec

ENTRY_POINT_GROUP = "aotc.runners"
# The matrix's runner when it names none (docs/design.md, "Matrix"): the first backend aotc had.
DEFAULT_RUNNER = "vllm-tpu"


class Planner(ABC):
    """A backend's plan side (in the spirit of fsspec's ``AbstractFileSystem``): the stack's padding rules and
    warm-up loops re-implemented as pure functions of an entry and its model config, so plan and fingerprint run
    without the stack. Two methods are required; every other one has a default a backend overrides only when
    its stack has that rule. It must stay import-light: no heavy stack at module level or in these methods."""

    @abstractmethod
    def capture_plan(self, entry: Entry, hf_config: dict | None) -> list[GraphSpec]:
        """Every graph the entry needs, in the order the stack's warm-up compiles them."""

    @abstractmethod
    def bucket_summary(self, entry: Entry, hf_config: dict | None) -> dict[str, Any]:
        """The padded buckets behind the plan, for ``aotc plan`` and the report, from the config ``capture_plan``
        read (a model-dependent rule, e.g. an MLA model's KV block size, reads that one, not the file again)."""

    def kv_block_size(self, entry: Entry) -> int | None:
        """Tokens per KV block (vLLM's ``CacheConfig.block_size``, which the Pallas backends' ``get_page_size``
        sets), for the full-length block count (``RunnerSpec.kv_blocks``' default); None: the runner pins no
        block count."""
        return None

    def implied_flags(self, entry: Entry) -> dict[str, tuple[str, ...]]:
        """XLA_FLAGS / LIBTPU_INIT_ARGS words the runner adds for this entry (e.g. the twin's device count); what
        the stack adds for every entry at import is ``RunnerSpec.stack_flags``."""
        return {}

    def implied_env(self, entry: Entry) -> dict[str, str]:
        """Values of ``env_vars`` the entry implies when the matrix sets none (e.g. LoRA's model code)."""
        return {}

    def mesh(self, entry: Entry) -> dict[str, Any] | None:
        """The device mesh the entry's graphs are sharded over; None: the runner declares none."""
        return None

    def traffic_images(self, entry: Entry, hf_config: dict | None) -> tuple[tuple[int, int, int], ...]:
        """(height, width, image tokens) of the images a server of this entry is sent (the sweep's and the
        canary's); () for a text model."""
        return ()

    def serving_fixes(self, entry: Entry, hf_config: dict | None) -> tuple[str, ...]:
        """Modules the runner's plugin installs in every serving process (a pod's too) that change which graphs a
        server of this entry compiles (e.g. aotc/runners/tpu_inference/serving_fixes/): the fingerprint hashes
        their code, so an artifact is never served under other fixes. () for none."""
        return ()


@dataclass(frozen=True)
class RunnerSpec(ABC):
    """A backend, as the core sees it (in the spirit of vLLM's ``Platform``): static facts are fields, each hook
    is a documented method taking an ``Entry``, with a default where one makes sense; the plan side is the
    ``planner`` (required). A backend subclasses it, overrides the hooks its stack has (importing its heavy
    modules inside them, never at class level) and registers one instance. The core resolves it once per entry
    (``load_runner``) and calls only these methods."""

    name: str
    """The matrix's ``runner:`` value, e.g. ``vllm-tpu``."""
    module: str
    """Run as ``python -m <module> {build|verify} REQUEST.json RESULT.json`` (aotc/runners/protocol.py)."""
    packages: tuple[str, ...]
    """Distributions whose versions enter the fingerprint (read from metadata, never imported)."""
    env_vars: tuple[str, ...] = ()
    """Every environment variable the stack reads but ``env_unhashed``: the fingerprint hashes each one set, so
    a builder's or a pod's stray setting never goes unseen (aotc/runners/stack_env.py)."""
    env_unhashed: Mapping[str, str] = field(default_factory=dict)
    """Variables the stack reads that change no graph and no key -> why; the fingerprint leaves them out."""
    env_settable: Mapping[str, Any] | None = None
    """The ``env_vars`` a matrix's ``env:`` may set -> the type of its value (a pydantic annotation: a choice, a
    bound), where the plan follows only some of what the stack reads (a variable that changes the stack's
    buckets and not the plan's would build a cache that misses). None: every one of ``env_vars``, a string or
    an integer. tests/test_stack_env.py holds each one to ``env_vars``."""
    env_registries: tuple[str, ...] = ()
    """Modules of the stack whose ``environment_variables`` name what it reads: a test holds ``env_vars`` and
    ``env_unhashed`` to them, in the runner's interpreter."""
    stack_flags: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Flags the stack itself adds to XLA_FLAGS / LIBTPU_INIT_ARGS at import, before anything compiles, for
    every entry (the runner's own per-entry words are ``Planner.implied_flags``)."""
    devices: tuple[str, ...] = ("cpu", "tpu")
    unserved: Mapping[str, str] = field(default_factory=dict)
    """Request options the stock server of this stack cannot serve -> why (the upstream reference). The
    canary leaves them out of its load and reports each one: a documented limitation, never a silent skip."""
    unserved_with_images: Mapping[str, str] = field(default_factory=dict)
    """As ``unserved``, for an entry whose server is sent images (``Planner.traffic_images``)."""
    pins: Mapping[str, str] = field(default_factory=dict)
    """The versions of ``packages`` this aotc supports (its lock file; a test keeps them equal): the
    fingerprint's versions where the runner's interpreter is not installed, e.g. a fetch init container."""
    cache_loads: bool = False
    """The stack reads its persistent cache back: a build may seed it from the store (aotc/reuse.py) and the
    runner's build result lists ``cache_reads`` / ``cache_writes`` (cache file names)."""
    loads_models: bool = True
    """The stack loads the matrix's model as vLLM does (a hub id from the Hugging Face hub): a build fetches a hub
    model's config.json, which the plan reads, before planning. False for a runner without a model."""
    tpu_targets_on_cpu_host: bool = False
    """A ``device: tpu`` entry builds on a host with no TPU: the stack compiles every graph for the entry's TPU
    topology through the TPU compiler (compile-only devices) and its KV sizing runs against that TPU's HBM.
    Such an artifact's keys are proven in a fresh process; that a TPU loads it, only a TPU can show."""
    twin_package: str | None = None
    """The package of the runner's CPU twin, whose code enters the compiled graphs of ``device: cpu`` entries
    (e.g. its stand-in attention): the fingerprint hashes every module of it, so a changed twin never reuses
    stale graphs and a module added to it cannot be left out of the hash. None: the runner has no twin."""

    # -- plan side ---------------------------------------------------------------------------------------------
    @property
    @abstractmethod
    def planner(self) -> Planner:
        """The backend's ``Planner`` (required). A planner module that is not import-light is imported here, on
        first use."""

    def kv_blocks(self, entry: Entry, environ: Mapping[str, str]) -> int | None:
        """The KV block count a stock server of this stack gives an entry that pins none (vLLM's
        ``num_gpu_blocks_override``, a shape in every backbone graph). Default: the full-length rule, every
        sequence at ``max_model_len`` (``Planner.kv_block_size`` tokens a block) + vLLM's null block; None: the
        runner pins no block count. A stack that sizes the cache itself on the entry's device overrides this
        and ``kv_sizing_inputs`` (both: ``SizedByStack`` in aotc/runners/kv_sizing.py)."""
        block_size = self.planner.kv_block_size(entry)
        return full_length_blocks(entry.max_num_seqs, entry.max_model_len, block_size) if block_size else None

    def kv_sizing_inputs(self, environ: Mapping[str, str]) -> dict[str, Any] | None:
        """None: ``kv_blocks`` is a rule of the entry alone. Otherwise ``kv_blocks`` starts the stack, and this is
        what its answer depends on besides the fingerprint inputs (the variables it reads, its code's digest):
        the core keeps each answer keyed on both and starts no stack where it may not (aotc/kv.py)."""
        return None

    def matrix_env(self) -> Mapping[str, Any]:
        """What a matrix's ``env:`` may set for this runner: variable -> the type of its value."""
        if self.env_settable is None:
            from pydantic import StrictInt, StrictStr

            return {var: StrictStr | StrictInt for var in self.env_vars}
        return self.env_settable

    def runner_env(self, entry: Entry, environ: Mapping[str, str]) -> dict[str, str]:
        """The runner-read variables as the build will set them: the matrix's value, else what the runner
        implies for the entry (``Planner.implied_env``), else the process's."""
        implied = self.planner.implied_env(entry)
        env = {}
        for var in self.env_vars:
            if var in entry.env:
                env[var] = str(entry.env[var])
            elif var in implied:
                env[var] = implied[var]
            elif var in environ:
                env[var] = environ[var]
        return env

    # -- stack side: backends override these -----------------------------------------------------------------
    def validate(self, entry: Entry, hf_config: dict | None) -> list[str]:
        """The stack's own rules for an entry, one problem a line as ``KEY.PATH: reason`` (key path relative
        to the model, e.g. ``env.X: ...``); [] when valid."""
        return []

    def serve(self, entry: Entry, cache_dir: str) -> tuple[dict[str, Any], dict[str, str | None]]:
        """The stock ``vllm serve`` for an entry: (engine arguments, env; None means unset)."""
        raise NotImplementedError(f"runner {self.name} cannot describe its stock server")

    def loadability_probe(self) -> dict[str, Any] | None:
        """What ``aotc doctor`` reports: can this stack load its own persistent cache? At least ``loadable``
        (bool) and ``verdict`` (one line); None: the runner has no such probe. (A backend's ``probe`` modules are
        another thing: the compile evidence a build or verify records per call.)"""
        return None

    def tpu_targets(self, environ: Mapping[str, str] | None = None) -> list[dict[str, Any]] | None:
        """What ``aotc doctor`` lists: the TPU topologies this host can compile for without a TPU
        (``tpu_targets_on_cpu_host``), each as the TPU compiler names it; None: the runner cannot."""
        return None

    def watcher(self, guard: Any) -> Any | None:
        """The compile counter the serving guard installs in a serving process; None: unwatched (logged)."""
        return None

    def cache_log(self) -> dict[str, Any]:
        """Logging-only settings under which the stack logs each persistent-cache lookup: ``{"env": {...},
        "hit": regex, "miss": regex}``, each regex capturing (graph name, cache key); {}: no such log."""
        return {}

    def python(self, environ: Mapping[str, str] | None = None) -> str:
        """The interpreter the runner runs under: ``python_env`` if set, else this one (a stack that cannot
        share the core's venv gets its own)."""
        return (os.environ if environ is None else environ).get(self.python_env) or sys.executable

    @property
    def python_env(self) -> str:
        """The variable naming this runner's interpreter when its stack has its own venv."""
        return "AOTC_PYTHON_" + self.name.upper().replace("-", "_")


class UnknownRunner(ValueError):
    pass


@functools.cache
def registered() -> dict[str, RunnerSpec]:
    specs = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        spec = ep.load()
        if not isinstance(spec, RunnerSpec) or spec.name != ep.name:
            raise TypeError(f"entry point {ep.name} = {ep.value} is not a RunnerSpec named {ep.name!r}")
        specs[spec.name] = spec
    return specs


def load_runner(name: str) -> RunnerSpec:
    try:
        return registered()[name]
    except KeyError:
        known = ", ".join(sorted(registered())) or "none installed"
        raise UnknownRunner(f"unknown runner {name!r} (registered: {known})") from None


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def runner_python(runner: str, environ: Mapping[str, str] | None = None) -> str:
    """The interpreter a runner runs under (``RunnerSpec.python``)."""
    return load_runner(runner).python(environ)


def runner_versions(runner: str, environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """The runner's package versions, from the metadata of the interpreter that will run it.

    Where that stack is not installed at all (this interpreter lacks its packages and no
    AOTC_PYTHON_<RUNNER> names another, e.g. a fetch init container), the versions this aotc pins for the
    runner stand in: the stack a pod may serve with is the pinned one, and the guard in the running engine
    compares the real versions with the manifest's."""
    spec = load_runner(runner)
    python = spec.python(environ)
    if not _same_interpreter(python):
        return dict(_foreign_versions(python, spec.packages))
    found = {pkg: package_version(pkg) for pkg in spec.packages}
    if spec.pins and None in found.values():
        return {pkg: spec.pins.get(pkg) for pkg in spec.packages}
    return found


def _same_interpreter(python: str) -> bool:
    try:
        return Path(python).resolve() == Path(sys.executable).resolve()
    except OSError:
        return False


_VERSIONS_SCRIPT = """import json, sys
from importlib import metadata
from pathlib import Path
def v(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
json.dump({name: v(name) for name in sys.argv[1:]}, sys.stdout)
"""


@functools.lru_cache(maxsize=None)
def _foreign_versions(python: str, packages: tuple[str, ...]) -> tuple[tuple[str, str | None], ...]:
    # Metadata only, nothing imported: a ~50 ms subprocess, so plan/fingerprint stay light.
    try:
        out = subprocess.run([python, "-I", "-c", _VERSIONS_SCRIPT, *packages], capture_output=True, text=True,
                             timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise BadInput(f"cannot read package versions from runner interpreter {python}: {exc}") from None
    return tuple(json.loads(out).items())
