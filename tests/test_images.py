"""The images configs/k8s runs are the ones `make images` builds, from the locks `make env` installs, on a base
and with a uv pinned by digest and hash, and the manifests name them by digest.

Docker cannot build them here: this machine has no Docker daemon and no registry but PyPI (the Python base
image cannot be pulled, nor its digest read). So these tests read the recipe instead of running it: the real
`make -n` output (the commands `make images`, `make env` and `make env-jax` would run), docker/Dockerfile's
instructions, the lock files and every image field of the manifests; `make pin-images` runs for real against
a stand-in for `docker inspect`.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from .conftest import CONFIGS, REPO

DOCKERFILE = REPO / "docker" / "Dockerfile"
BASE_DIGESTS = REPO / "docker" / "base-images.lock"
UV_LOCK = REPO / "requirements" / "uv.lock"
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
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


def run_make(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    # run as from a shell even under `make test`: a sub-make would print "Entering directory" and inherit flags
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return subprocess.run(["make", "--no-print-directory", *args], cwd=REPO, capture_output=True, text=True,
                          check=check, env=env)


def base_versions() -> list[str]:
    """The Python versions docker/base-images.lock has a line for (a digest or not yet)."""
    return [line.split()[0] for line in BASE_DIGESTS.read_text().splitlines() if line.strip()
            and not line.startswith("#")]


@functools.cache
def filled_base_digests() -> Path:
    """docker/base-images.lock as a release fills it: this machine cannot reach Docker Hub to read real digests."""
    path = Path(tempfile.mkdtemp(prefix="aotc-base-digests-")) / "base-images.lock"
    atexit.register(shutil.rmtree, path.parent, True)
    path.write_text("".join(f"{v} sha256:{v.replace('.', '').ljust(64, '0')}\n" for v in base_versions()))
    return path


def recorded_digests(path: Path) -> dict[str, str]:
    return dict(line.split() for line in path.read_text().splitlines() if DIGEST.search(line))


def make_dry_run(*targets: str) -> list[list[str]]:
    """The commands `make` would run (-n prints them, -B as if nothing were installed yet), split as a shell would."""
    out = run_make("-nB", *targets, f"BASE_DIGESTS={filled_base_digests()}").stdout
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


def manifest_images(k8s: Path = CONFIGS / "k8s") -> set[str]:
    def images(node: object):
        if isinstance(node, dict):
            yield from (v for k, v in node.items() if k == "image")
            for value in node.values():
                yield from images(value)
        elif isinstance(node, list):
            for value in node:
                yield from images(value)

    return {image for path in k8s.glob("*.yaml") for doc in yaml.safe_load_all(path.read_text())
            for image in images(doc)}


def tag_and_digest(image: str) -> tuple[str, str | None]:
    tag, _, digest = image.partition("@")
    return tag, digest or None


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
    uv_lock_copies = [c[-1] for c in copies if c[:-1] == ["requirements/uv.lock"]]
    pip_commands = [cmd for name, args in steps if name == "RUN" for cmd in shell_commands(args) if "pip" in cmd]
    checked = [pip_step(cmd, lock_copies, aotc_dirs, uv_lock_copies) for cmd in pip_commands]
    problems = [problem for _, problem in checked if problem]
    if len(lock_copies) != 1:
        problems.append(f"COPY ${{LOCK}} must appear once, found {len(lock_copies)}")
    if [step for step, _ in checked] != ["uv", "sync", "aotc"]:
        problems.append(f"installs in the order {[step for step, _ in checked]}, not uv, then the lock, then aotc")
    return problems


def pip_step(cmd: list[str], lock_copies: list[str], aotc_dirs: list[str],
             uv_lock_copies: list[str]) -> tuple[str, str | None]:
    """Which install step a pip command is, and what is wrong with it (None: nothing)."""
    if cmd[:4] == ["python", "-m", "pip", "install"] and any("uv" in word for word in cmd[4:]):
        hashed = "--require-hashes" in cmd and cmd[-2:-1] == ["-r"] and cmd[-1] in uv_lock_copies
        return "uv", None if hashed else f"{shlex.join(cmd)}: must install the copied requirements/uv.lock " \
                                         "with --require-hashes"
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
    assert {tag_and_digest(image)[0] for image in manifest_images()} == built


def test_the_manifests_name_each_image_by_digest():
    """A tag can be pushed over; `make pin-images` writes the digest (the all-zero one in git pulls nothing)."""
    assert all(DIGEST.fullmatch(tag_and_digest(image)[1] or "") for image in manifest_images())


# `docker inspect --format '{{index .RepoDigests 0}}' TAG` for an image pushed to TAG's repository, and for one
# built but never pushed (no RepoDigests: docker fails on the index)
PUSHED = """#!/bin/sh
tag="$4"
printf '%s@sha256:%s\\n' "${tag%:*}" "$(printf %s "$tag" | sha256sum | cut -c1-64)"
"""
NOT_PUSHED = """#!/bin/sh
echo 'template: :1:2: executing "" at <index .RepoDigests 0>: error calling index: index out of range: 0' >&2
exit 1
"""


def pin_images(tmp_path: Path, docker_script: str) -> tuple[subprocess.CompletedProcess, Path]:
    """`make pin-images` on a copy of configs/k8s, with ``docker_script`` standing in for docker."""
    docker = tmp_path / "docker"
    docker.write_text(docker_script)
    docker.chmod(0o755)
    k8s = tmp_path / "k8s"
    shutil.copytree(CONFIGS / "k8s", k8s)
    return run_make("pin-images", f"DOCKER={docker}", f"K8S_DIR={k8s}", check=False), k8s


def without_digests(text: str) -> str:
    return re.sub(r"@sha256:[0-9a-f]+", "", text)


def test_make_pin_images_writes_the_pushed_digests_into_the_manifests(tmp_path):
    proc, k8s = pin_images(tmp_path, PUSHED)
    assert proc.returncode == 0, proc.stderr
    assert manifest_images(k8s) == {f"{b.tag}@sha256:{hashlib.sha256(b.tag.encode()).hexdigest()}"
                                    for b in image_builds()}
    for path in (CONFIGS / "k8s").glob("*.yaml"):  # nothing but the digests changed
        assert without_digests((k8s / path.name).read_text()) == without_digests(path.read_text())


def test_make_pin_images_refuses_an_image_not_pushed(tmp_path):
    proc, k8s = pin_images(tmp_path, NOT_PUSHED)
    assert proc.returncode == 2 and "make push-images first" in proc.stderr
    assert manifest_images(k8s) == manifest_images()


def test_make_images_refuses_a_base_image_without_a_digest(tmp_path):
    unpinned = tmp_path / "base-images.lock"
    for content in ("".join(f"{v}\n" for v in base_versions()),
                    "".join(f"{v} sha256:abc\n" for v in base_versions())):  # no digest; not one
        unpinned.write_text(content)
        proc = run_make("-nB", "images", f"BASE_DIGESTS={unpinned}", check=False)
        assert proc.returncode == 2 and "docker build" not in proc.stdout
        assert f"no digest for python:{base_versions()[0]}-slim-bookworm in {unpinned}" in proc.stderr


@pytest.mark.parametrize("build", image_builds(), ids=lambda b: b.repository)
def test_each_image_builds_on_the_base_digest_recorded_for_its_python(build: ImageBuild):
    assert build.build_args["BASE_DIGEST"] == recorded_digests(filled_base_digests())[build.build_args["PYTHON"]]
    # the repository's own record: each line a digest, or none yet (then `make images` refuses, above)
    assert set(recorded_digests(BASE_DIGESTS)) <= set(base_versions())


def test_uv_is_pinned_by_hash_at_the_makefile_version():
    [uv_version] = re.findall(r"^UV_VERSION := (\S+)", (REPO / "Makefile").read_text(), re.M)
    requirements = pinned_requirements(UV_LOCK.read_text())
    assert [r.split()[0] for r in requirements] == [f"uv=={uv_version}"]
    assert "--hash=sha256:" in requirements[0]
    # the Makefile installs a missing uv from the same hashes
    assert "--require-hashes --only-binary :all:" in (REPO / "Makefile").read_text()


@pytest.mark.parametrize("build", image_builds(), ids=lambda b: b.repository)
def test_each_image_installs_the_lock_its_make_target_syncs(build: ImageBuild):
    assert build.dockerfile == DOCKERFILE
    assert build.build_args["LOCK"] == synced_lock(STACK_TARGET[build.repository])
    lock = REPO / build.build_args["LOCK"]
    [resolved_for] = re.findall(r"--python-version (\S+)", lock.read_text().split("\n", 2)[1])
    assert build.build_args["PYTHON"] == resolved_for  # the interpreter the lock's wheels were picked for


@pytest.mark.parametrize("build", image_builds(), ids=lambda b: b.repository)
def test_the_tag_names_the_locked_vllm_and_aotc_versions(build: ImageBuild):
    """Tag scheme: <its vLLM package><version>-aotc<version>, e.g. vllm0.13.0-aotc0.1.0."""
    package, version, aotc = re.fullmatch(r"([a-z-]+?)(\d[\w.+]*)-aotc(.+)", build.tag.rsplit(":", 1)[1]).groups()
    assert locked_versions(REPO / build.build_args["LOCK"])[package] == version
    assert re.search(rf'^version = "{re.escape(aotc)}"$', (REPO / "pyproject.toml").read_text(), re.M)


def pinned_requirements(lock_text: str) -> list[str]:
    """Each requirement of a hashed lock, its continuation lines joined; comment lines dropped."""
    body = "\n".join(line for line in lock_text.splitlines() if not line.lstrip().startswith("#"))
    return [r for r in re.split(r"\n(?=[A-Za-z0-9])", body.strip()) if r]


@pytest.mark.parametrize("build", image_builds(), ids=lambda b: b.repository)
def test_every_requirement_of_the_lock_is_pinned_with_a_hash(build: ImageBuild):
    requirements = pinned_requirements((REPO / build.build_args["LOCK"]).read_text())
    unpinned = [r.split()[0] for r in requirements if not re.match(r"\S+==\S+", r) or "--hash=sha256:" not in r]
    assert requirements and not unpinned


def test_the_dockerfile_installs_exactly_the_lock_then_aotc():
    text = DOCKERFILE.read_text()
    assert install_problems(text) == []
    assert [args for name, args in instructions(text) if name == "FROM"] == ["python:${PYTHON}-slim-bookworm@${BASE_DIGEST}"]


@pytest.mark.parametrize("old, new", [
    ("uv pip sync --require-hashes", "uv pip sync"),
    ("uv pip sync --require-hashes --compile-bytecode", "uv pip install --compile-bytecode -r"),
    ("uv pip install --no-deps", "uv pip install"),
    ("/tmp/aotc-src \\\n", "-e /tmp/aotc-src \\\n"),
    ("COPY ${LOCK} /opt/aotc/stack.lock", "COPY requirements/core.lock /opt/aotc/stack.lock"),
    (" && aotc --help", " && pip install vllm && aotc --help"),
    ("pip install --no-cache-dir --require-hashes", "pip install --no-cache-dir"),
    ("-r /opt/aotc/uv.lock", "uv==0.13.9"),
], ids=["no-hashes", "install-r", "with-deps", "editable", "other-lock", "extra-package", "uv-without-hashes",
        "uv-by-version"])
def test_the_install_check_catches_a_dockerfile_that_strays_from_the_lock(old: str, new: str):
    text = DOCKERFILE.read_text()
    assert old in text
    assert install_problems(text.replace(old, new))
