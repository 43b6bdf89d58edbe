"""The images configs/k8s runs are the ones `make images` builds, from the locks `make env` installs.

Docker cannot build them here: this machine has no Docker daemon and no registry but PyPI (the Python base
image cannot be pulled). So these tests read the recipe instead of running it: the real `make -n` output
(the commands `make images`, `make env` and `make env-jax` would run), docker/Dockerfile's instructions,
the lock files and every image field of the manifests.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from .conftest import CONFIGS, REPO

DOCKERFILE = REPO / "docker" / "Dockerfile"
# which `make` target installs each image's stack on a developer's machine
STACK_TARGET = {"vllm-tpu-aotc": "env", "vllm-tpu-jax-aotc": "env-jax"}


@dataclass(frozen=True)
class ImageBuild:
    tag: str
    dockerfile: Path
    build_args: dict[str, str]

    @property
    def repository(self) -> str:  # us-docker.pkg.dev/PROJECT/serving/vllm-tpu-aotc:v → vllm-tpu-aotc
        return self.tag.rsplit(":", 1)[0].rsplit("/", 1)[1]


def make_dry_run(*targets: str) -> list[list[str]]:
    """The commands `make` would run (-n prints them, -B as if nothing were installed yet), split as a shell would."""
    # run as from a shell even under `make test`: a sub-make would print "Entering directory" and inherit flags
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    out = subprocess.run(["make", "--no-print-directory", "-nB", *targets], cwd=REPO, capture_output=True,
                         text=True, check=True, env=env).stdout
    return [shlex.split(line) for line in out.replace("\\\n", " ").splitlines() if line.strip()]


def option_values(words: list[str], flag: str) -> list[str]:
    return [words[i + 1] for i, word in enumerate(words[:-1]) if word == flag]


def image_builds() -> list[ImageBuild]:
    builds = []
    for words in make_dry_run("images"):
        assert words[1] == "build", f"`make images` runs only docker builds, not {shlex.join(words)}"
        [tag], [dockerfile] = option_values(words, "-t"), option_values(words, "-f")
        args = dict(arg.split("=", 1) for arg in option_values(words, "--build-arg"))
        builds.append(ImageBuild(tag, REPO / dockerfile, args))
    return builds


def synced_lock(target: str) -> str:
    """The lock file `make <target>` installs its venv from."""
    [sync] = [w for w in make_dry_run(target) if w[1:3] == ["pip", "sync"]]
    return sync[-1]


def manifest_images() -> set[str]:
    def images(node: object):
        if isinstance(node, dict):
            yield from (v for k, v in node.items() if k == "image")
            for value in node.values():
                yield from images(value)
        elif isinstance(node, list):
            for value in node:
                yield from images(value)

    return {image for path in (CONFIGS / "k8s").glob("*.yaml") for doc in yaml.safe_load_all(path.read_text())
            for image in images(doc)}


def locked_versions(lock: Path) -> dict[str, str]:
    return dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", lock.read_text(), re.M))


def instructions(dockerfile_text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction: continuation lines joined, comments dropped."""
    lines = [line for line in dockerfile_text.splitlines() if not line.lstrip().startswith("#")]
    joined = "\n".join(lines).replace("\\\n", " ")
    return [(word.upper(), rest.strip()) for word, _, rest in
            (line.strip().partition(" ") for line in joined.splitlines() if line.strip())]


def shell_commands(run: str) -> list[list[str]]:
    return [shlex.split(part) for part in re.split(r"&&|\|\||;", run) if part.strip()]


def install_problems(dockerfile_text: str) -> list[str]:
    """What keeps this Dockerfile from installing exactly ``${LOCK}`` plus aotc (empty: nothing)."""
    steps = instructions(dockerfile_text)
    copies = [shlex.split(args) for name, args in steps if name == "COPY"]
    lock_copies = [c[-1] for c in copies if c[:-1] == ["${LOCK}"]]
    aotc_dirs = [c[-1] for c in copies if c[:-1] == ["aotc"]]
    pip_commands = [cmd for name, args in steps if name == "RUN" for cmd in shell_commands(args) if "pip" in cmd]
    checked = [pip_step(cmd, lock_copies, aotc_dirs) for cmd in pip_commands]
    problems = [problem for _, problem in checked if problem]
    if len(lock_copies) != 1:
        problems.append(f"COPY ${{LOCK}} must appear once, found {len(lock_copies)}")
    if [step for step, _ in checked] != ["uv", "sync", "aotc"]:
        problems.append(f"installs in the order {[step for step, _ in checked]}, not uv, then the lock, then aotc")
    return problems


def pip_step(cmd: list[str], lock_copies: list[str], aotc_dirs: list[str]) -> tuple[str, str | None]:
    """Which install step a pip command is, and what is wrong with it (None: nothing)."""
    if cmd == ["python", "-m", "pip", "install", "--no-cache-dir", "uv==${UV_VERSION}"]:
        return "uv", None
    if cmd[:3] == ["uv", "pip", "sync"]:
        hashed = "--require-hashes" in cmd and cmd[-1] in lock_copies
        return "sync", None if hashed else f"{shlex.join(cmd)}: must sync the copied ${{LOCK}} with --require-hashes"
    if cmd[:3] == ["uv", "pip", "install"]:
        from_copy = any(d.rstrip("/").startswith(cmd[-1].rstrip("/")) for d in aotc_dirs)
        exact = "--no-deps" in cmd and not {"-e", "--editable"} & set(cmd) and from_copy
        return "aotc", None if exact else f"{shlex.join(cmd)}: must install the copied aotc, --no-deps, not editable"
    return "other", f"{shlex.join(cmd)}: installs something the lock does not pin"


def test_every_image_the_manifests_name_is_one_make_images_builds():
    built = {build.tag for build in image_builds()}
    assert manifest_images() == built


@pytest.mark.parametrize("build", image_builds(), ids=lambda b: b.repository)
def test_each_image_installs_the_lock_its_make_target_syncs(build: ImageBuild):
    assert build.dockerfile == DOCKERFILE
    assert build.build_args["LOCK"] == synced_lock(STACK_TARGET[build.repository])
    lock = REPO / build.build_args["LOCK"]
    [resolved_for] = re.findall(r"--python-version (\S+)", lock.read_text().split("\n", 2)[1])
    assert build.build_args["PYTHON"] == resolved_for  # the interpreter the lock's wheels were picked for
    [uv_version] = re.findall(r"^UV_VERSION := (\S+)", (REPO / "Makefile").read_text(), re.M)
    assert build.build_args["UV_VERSION"] == uv_version


@pytest.mark.parametrize("build", image_builds(), ids=lambda b: b.repository)
def test_the_tag_names_the_locked_vllm_and_aotc_versions(build: ImageBuild):
    """Tag scheme: <its vLLM package><version>-aotc<version>, e.g. vllm0.13.0-aotc0.1.0."""
    package, version, aotc = re.fullmatch(r"([a-z-]+?)(\d[\w.+]*)-aotc(.+)", build.tag.rsplit(":", 1)[1]).groups()
    assert locked_versions(REPO / build.build_args["LOCK"])[package] == version
    assert re.search(rf'^version = "{re.escape(aotc)}"$', (REPO / "pyproject.toml").read_text(), re.M)


@pytest.mark.parametrize("build", image_builds(), ids=lambda b: b.repository)
def test_every_requirement_of_the_lock_is_pinned_with_a_hash(build: ImageBuild):
    text = (REPO / build.build_args["LOCK"]).read_text()
    requirements = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2])
    unpinned = [r.split()[0] for r in requirements if not re.match(r"\S+==\S+", r) or "--hash=sha256:" not in r]
    assert not unpinned


def test_the_dockerfile_installs_exactly_the_lock_then_aotc():
    text = DOCKERFILE.read_text()
    assert install_problems(text) == []
    assert ("FROM", "python:${PYTHON}-slim-bookworm") in instructions(text)


@pytest.mark.parametrize("old, new", [
    ("uv pip sync --require-hashes", "uv pip sync"),
    ("uv pip sync --require-hashes --compile-bytecode", "uv pip install --compile-bytecode -r"),
    ("uv pip install --no-deps", "uv pip install"),
    ("/tmp/aotc-src \\\n", "-e /tmp/aotc-src \\\n"),
    ("COPY ${LOCK} /opt/aotc/stack.lock", "COPY requirements/core.lock /opt/aotc/stack.lock"),
    (" && aotc --help", " && pip install vllm && aotc --help"),
], ids=["no-hashes", "install-r", "with-deps", "editable", "other-lock", "extra-package"])
def test_the_install_check_catches_a_dockerfile_that_strays_from_the_lock(old: str, new: str):
    text = DOCKERFILE.read_text()
    assert old in text
    assert install_problems(text.replace(old, new))
