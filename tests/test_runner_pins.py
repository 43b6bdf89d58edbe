"""Each runner's pins (the fingerprint's versions where its venv is absent) are its lock file's."""

from __future__ import annotations

import re

import pytest

from aotc.runners.spec import load_runner

from .conftest import REPO

LOCKS = {"vllm-tpu": "full.lock", "tpu-inference": "jax.lock"}


def locked(lock: str) -> dict[str, str]:
    text = (REPO / "requirements" / lock).read_text()
    return {re.sub(r"[-_.]+", "-", m[1]).lower(): m[2] for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+)", text, re.M)}


@pytest.mark.parametrize("runner", sorted(LOCKS))
def test_pins_are_the_lock_files(runner):
    spec = load_runner(runner)
    versions = locked(LOCKS[runner])
    assert set(spec.pins) == set(spec.packages)
    assert {p: versions[re.sub(r"[-_.]+", "-", p).lower()] for p in spec.packages} == dict(spec.pins)
