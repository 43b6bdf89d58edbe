"""The tpu-inference runner's tests run from the core's venv and drive the JAX venv through subprocesses.

The JAX venv is required, never skipped: `make test` (and CI) installs it with `make env-jax`.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from aotc.files import aotc_home
from tests.conftest import launch_environ, shared_across_workers

REPO = Path(__file__).resolve().parents[2]
JAX_LOCK = REPO / "requirements" / "jax.lock"
PYTHON_ENV = "AOTC_PYTHON_TPU_INFERENCE"
FIND_STACK = """
import importlib.util, sys
missing = [name for name in ("aotc.runners.tpu_inference.plugin", "tpu_inference", "jax", "vllm")
           if importlib.util.find_spec(name) is None]
sys.exit(f"not found: {', '.join(missing)}" if missing else 0)
"""


def jax_python() -> Path:
    """AOTC_PYTHON_TPU_INFERENCE, else the venv `make env-jax` creates for the current lock."""
    if os.environ.get(PYTHON_ENV):
        return Path(os.environ[PYTHON_ENV])
    digest = hashlib.sha256(JAX_LOCK.read_bytes()).hexdigest()[:12]
    return aotc_home() / f"venv-jax-{digest}" / "bin" / "python"


@pytest.fixture(scope="session")
def jax_env() -> dict[str, str]:
    """The environment that points the core at the JAX venv; fails loudly when it is missing."""
    python = jax_python()
    if not python.is_file():
        pytest.fail(f"the JAX venv is missing ({python} does not exist): run `make env-jax`, or set {PYTHON_ENV} "
                    "to a Python 3.12 with requirements/jax.lock and aotc installed", pytrace=False)
    # finds the modules without importing the stack (an import of JAX and vLLM costs 13 to 17 s per xdist
    # worker); a broken install of what it finds fails the first test that runs it, with its stderr
    probe = subprocess.run([str(python), "-c", FIND_STACK], capture_output=True, text=True, timeout=120,
                           env=os.environ)
    if probe.returncode:
        pytest.fail(f"the JAX venv at {python} does not hold aotc and the tpu-inference stack (run `make env-jax`): "
                    f"{probe.stderr.strip().splitlines()[-1:]}", pytrace=False)
    # vLLM 0.13 (the core's) and vLLM 0.32 (this venv's) keep their registry's model-class facts under the same
    # file names in $VLLM_CACHE_ROOT/modelinfos, each hashing its own source: on a shared root every process of
    # one stack after one of the other finds the file stale and inspects the class again in a subprocess (an
    # import of vLLM, 10 to 20 s; 14 rewrites of Llama's in one suite run). This stack gets a root of its own.
    return {**launch_environ(), PYTHON_ENV: str(python),
            "VLLM_CACHE_ROOT": str(aotc_home() / "vllm-cache-tpu-inference")}


# Scripts that each install the CPU twin (twin.install() is idempotent) and read only its kernels against their own
# references: they share one process of jax_scripts.py, once per run (test_twin_gdn_jax, test_twin_moe_jax).
TWIN_KERNEL_SCRIPTS = ("gdn_facts.py", "moe_facts.py")


@pytest.fixture(scope="session")
def twin_kernel_facts(jax_env, tmp_path_factory) -> dict[str, dict]:
    """Each of TWIN_KERNEL_SCRIPTS' answers, by script."""
    return shared_scripts(jax_env, tmp_path_factory, "twin-kernel-facts", {script: {} for script in TWIN_KERNEL_SCRIPTS})


# Scripts that only import the stack and read it (no environment set, no patch, no plugin load), of two modules
# (test_tpu_path_jax, test_zoo_jax): one process of jax_scripts.py once per run.
TPU_PATH_ROOTS = ["tpu_inference.kernels.*", "tpu_inference.layers.*", "tpu_inference.lora.*",
                  "tpu_inference.spec_decode.*", "tpu_inference.runner.tpu_runner", "tpu_inference.worker.tpu_worker"]
STACK_READERS = {"../helpers/tpu_imports.py": {"roots": TPU_PATH_ROOTS}, "jax_registry.py": {}}


@pytest.fixture(scope="session")
def stack_readers(jax_env, tmp_path_factory) -> dict[str, dict]:
    """Each of STACK_READERS' answers, by script."""
    return shared_scripts(jax_env, tmp_path_factory, "stack-readers", STACK_READERS)


def shared_scripts(jax_env, tmp_path_factory, name: str, payloads: dict[str, dict]) -> dict[str, dict]:
    """The answers of scripts run in one process of jax_scripts.py, in order, once per run: the first xdist worker
    to ask runs them, the other reads its answers."""
    with shared_across_workers(tmp_path_factory, name) as shared:
        record = shared / "answers.json"
        if not record.is_file():
            record.write_text(json.dumps(run_scripts(jax_env, payloads)))
        return json.loads(record.read_text())


def run_scripts(jax_env: dict[str, str], payloads: dict[str, dict]) -> dict[str, dict]:
    """Each script's answer, by script, from one process of jax_scripts.py running them in order."""
    answers = run_jax(jax_env, Path(__file__).with_name("jax_scripts.py"), {"runs": list(payloads.items())})["answers"]
    return dict(zip(payloads, answers))


def run_jax(jax_env: dict[str, str], script: Path, payload: dict, timeout: float = 900) -> dict:
    """Run a helper script under the JAX interpreter: JSON in on stdin, JSON out on the last stdout line."""
    proc = subprocess.run([jax_env[PYTHON_ENV], str(script)], input=json.dumps(payload), capture_output=True,
                          text=True, timeout=timeout, env={**jax_env, "JAX_PLATFORMS": "cpu",
                                                            "TPU_ACCELERATOR_TYPE": "v6e-1", "TPU_NAME": "t",
                                                            "TPU_WORKER_ID": "0", "XLA_FLAGS": "",
                                                            "LIBTPU_INIT_ARGS": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def stack_method_source(jax_env: dict[str, str], module: str, cls: str, method: str) -> str:
    """The source of ``cls.method`` as the JAX venv installs ``module``, read from its file: what
    inspect.getsource gives there, without the import of the stack (13 to 17 s of CPU) that importing it costs."""
    top, *rest = module.split(".")
    find = f"import importlib.util; print(importlib.util.find_spec({top!r}).submodule_search_locations[0])"
    proc = subprocess.run([jax_env[PYTHON_ENV], "-I", "-c", find], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = Path(proc.stdout.strip(), *rest).with_suffix(".py").read_text()  # a module inside the package
    [klass] = [n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == cls]
    [function] = [n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == method]
    return ast.get_source_segment(text, function)
