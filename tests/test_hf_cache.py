"""A hub model's config.json, offline: aotc/hf_cache.py reads the Hugging Face cache exactly as huggingface_hub
does, the matrix checks and the plan read a cached config, the fingerprint never does, and a build that cannot
get one stops before anything starts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aotc.fingerprint import fingerprint_entry
from aotc.hf_cache import cached_file, hub_cache_dir
from aotc.matrix import load_matrix

from .conftest import CONFIGS, run_aotc

MODEL = "Qwen/Qwen3-30B-A3B"
COMMIT = "ad44e777bcd18fa416d9da3bd8f70d33ebb85d39"
TINY_MOE = CONFIGS / "models" / "tiny-qwen3-moe" / "config.json"


def cache_model(cache: Path, repo_id: str, commit: str, config: Path | None, refs: dict[str, str] | None = None,
                no_exist: bool = False) -> None:
    """A model in a Hugging Face cache as huggingface_hub lays it out."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "snapshots" / commit).mkdir(parents=True, exist_ok=True)
    if config is not None:
        shutil.copy(config, repo / "snapshots" / commit / "config.json")
    for ref, target in (refs or {}).items():
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(target)
    if no_exist:
        (repo / ".no_exist" / commit).mkdir(parents=True)
        (repo / ".no_exist" / commit / "config.json").touch()


def test_lookup_is_huggingface_hubs(tmp_path):
    from huggingface_hub import try_to_load_from_cache

    cache = tmp_path / "hub"
    cache_model(cache, MODEL, COMMIT, TINY_MOE, refs={"main": COMMIT, "v1": "f" * 40})
    cache_model(cache, MODEL, "e" * 40, None, no_exist=True)  # known absent at that commit
    cache_model(cache, "org/other", "d" * 40, TINY_MOE)
    cases = [(MODEL, r) for r in ("main", COMMIT, "v1", "f" * 40, "e" * 40, "nope", "d" * 40)]
    cases += [("org/other", "main"), ("org/other", "d" * 40), ("org/absent", "main")]
    for repo_id, revision in cases:
        theirs = try_to_load_from_cache(repo_id, "config.json", cache_dir=str(cache), revision=revision)
        expected = Path(theirs) if isinstance(theirs, str) else None  # their "cached as absent" is our None
        assert cached_file(repo_id, "config.json", revision, cache) == expected, (repo_id, revision)
    assert cached_file(MODEL, "config.json", "main", cache) is not None  # the cases reach both answers


@pytest.mark.parametrize("variables", [{}, {"HF_HOME": "{tmp}/home"}, {"XDG_CACHE_HOME": "{tmp}/xdg"},
                                       {"HF_HOME": "~/hf", "XDG_CACHE_HOME": "{tmp}/xdg"},
                                       {"HUGGINGFACE_HUB_CACHE": "{tmp}/legacy", "HF_HOME": "{tmp}/home"},
                                       {"HF_HUB_CACHE": "{tmp}/hub", "HUGGINGFACE_HUB_CACHE": "{tmp}/legacy"},
                                       {"HF_HUB_CACHE": "$AOTC_TEST_ROOT/hub", "AOTC_TEST_ROOT": "{tmp}"}])
def test_cache_dir_is_huggingface_hubs(variables, tmp_path):
    names = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")
    env = {k: v for k, v in os.environ.items() if k not in names}
    env.update({k: v.format(tmp=tmp_path) for k, v in variables.items()})
    probe = ("from huggingface_hub import constants; from aotc.hf_cache import hub_cache_dir; "
             "print(constants.HF_HUB_CACHE); print(hub_cache_dir())")
    theirs, ours = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env,
                                  check=True).stdout.splitlines()
    assert Path(ours) == Path(theirs)


def hub_matrix(tmp_path: Path, max_model_len: int = 128, runner: str = "vllm-tpu") -> Path:
    config = tmp_path / "hub.yaml"
    config.write_text(f"defaults: {{runner: {runner}, device: cpu, engine: {{num_gpu_blocks_override: 65}}}}\n"
                      f"models: [{{name: moe, model: {MODEL}, revision: {COMMIT}, matrix: {{max_model_len: "
                      f"[{max_model_len}], max_num_seqs: [8], max_num_batched_tokens: [64]}}}}]\n")
    return config


def test_matrix_checks_read_a_cached_hub_config(tmp_path):
    """vLLM refuses a max_model_len above the model's own limit; with the config cached, so does the matrix."""
    limit = json.loads(TINY_MOE.read_text())["max_position_embeddings"]
    too_long = hub_matrix(tmp_path, max_model_len=limit * 2)
    assert run_aotc("plan", too_long, env={"HF_HUB_CACHE": str(tmp_path / "hub")}).returncode == 0  # not cached
    cache_model(tmp_path / "hub", MODEL, COMMIT, TINY_MOE)
    refused = run_aotc("plan", too_long, env={"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert refused.returncode == 2 and "max_model_len" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


def test_plan_names_where_the_config_came_from(tmp_path):
    config = hub_matrix(tmp_path)
    env = {"HF_HUB_CACHE": str(tmp_path / "hub")}
    missing = run_aotc("plan", config, env=env)
    assert missing.returncode == 0, missing.stderr
    warning, = [line for line in missing.stdout.splitlines() if "config.json" in line]
    assert warning.startswith(f"{MODEL}@{COMMIT}: config.json is not in the Hugging Face cache ({tmp_path / 'hub'})")
    assert f"`hf download {MODEL} config.json --revision {COMMIT}`" in warning
    unavailable = json.loads(run_aotc("plan", config, "--json", env=env).stdout)["entries"][0]["model_config"]
    assert unavailable["source"] == "unavailable"
    cache_model(tmp_path / "hub", MODEL, COMMIT, TINY_MOE, refs={"main": COMMIT})
    found = run_aotc("plan", config, env=env)
    assert found.returncode == 0 and "not in the Hugging Face cache" not in found.stdout
    cached = json.loads(run_aotc("plan", config, "--json", env=env).stdout)["entries"][0]["model_config"]
    assert cached == {"source": "huggingface-cache",
                      "path": str(tmp_path / "hub" / "models--Qwen--Qwen3-30B-A3B" / "snapshots" / COMMIT /
                                  "config.json")}
    local = json.loads(run_aotc("plan", CONFIGS / "demo.yaml", "--json").stdout)["entries"][0]["model_config"]
    assert local == {"source": "local", "path": str(CONFIGS / "models" / "tiny-llama" / "config.json")}


@pytest.mark.needs_jax
def test_fingerprint_of_a_hub_model_is_the_same_with_or_without_its_cached_config(tmp_path, monkeypatch):
    """An init container has no Hugging Face cache: the key it computes must be the build machine's."""
    config = hub_matrix(tmp_path, runner="tpu-inference")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    entry = load_matrix(config, check_stack=False).entries[0]
    without = fingerprint_entry(entry, kv_blocks=65)
    cache_model(tmp_path / "hub", MODEL, COMMIT, TINY_MOE)
    assert hub_cache_dir() == tmp_path / "hub" and entry.readable_config_path is not None
    assert fingerprint_entry(entry, kv_blocks=65) == without


def test_build_stops_before_starting_when_a_hub_config_cannot_be_had(tmp_path):
    """The runner's own huggingface_hub fetches a missing config (here offline: it cannot); one line, exit 2,
    naming the model, the cache and the command, and nothing built."""
    config = hub_matrix(tmp_path)
    proc = run_aotc("build", config, "--out", tmp_path / "out", "--no-reuse",
                    env={"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}, timeout=120)
    assert proc.returncode == 2, proc.stderr
    line, = proc.stderr.strip().splitlines()
    assert f"config.json of {MODEL}@{COMMIT} is neither in the Hugging Face cache" in line
    assert "LocalEntryNotFoundError" in line and f"hf download {MODEL} config.json --revision {COMMIT}" in line
    assert not any((tmp_path / "out").iterdir())
