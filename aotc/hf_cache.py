"""A hub model's files as the Hugging Face cache holds them, read offline.

``aotc plan`` and the matrix checks need a model's config.json (is it MoE, multimodal, tied?) on machines
without the network or the weights: a CI runner, a laptop. A config that ``hf download`` or an earlier vLLM
start put in the cache is enough. The layout and the cache's location are huggingface_hub's
(``try_to_load_from_cache``, ``constants.HF_HUB_CACHE``); they are read here by hand because the light
commands run where huggingface_hub is not installed (the pod image's core lock), and
tests/test_hf_cache.py holds the two equal.
"""

from __future__ import annotations

import os
from pathlib import Path


def hub_cache_dir() -> Path:
    """The cache huggingface_hub reads: ``HF_HUB_CACHE``, else ``HUGGINGFACE_HUB_CACHE``, else
    ``$HF_HOME/hub`` (``HF_HOME`` defaulting to ``$XDG_CACHE_HOME/huggingface``, then ``~/.cache/huggingface``)."""
    home = _expand(os.getenv("HF_HOME", os.path.join(os.getenv("XDG_CACHE_HOME", "~/.cache"), "huggingface")))
    return Path(_expand(os.getenv("HF_HUB_CACHE", os.getenv("HUGGINGFACE_HUB_CACHE", os.path.join(home, "hub")))))


def _expand(path: str) -> str:
    return os.path.expandvars(os.path.expanduser(path))


def cached_file(repo_id: str, filename: str, revision: str = "main", cache_dir: Path | None = None) -> Path | None:
    """The cached ``filename`` of model ``repo_id`` at ``revision`` (a branch or tag the cache has a ref for,
    or a commit), or None when the cache does not hold it."""
    commit = cached_commit(repo_id, revision, cache_dir) or revision
    path = _repo_dir(repo_id, cache_dir) / "snapshots" / commit / filename
    return path if path.is_file() else None


def cached_commit(repo_id: str, revision: str, cache_dir: Path | None = None) -> str | None:
    """The commit a branch or tag names in the cache (its ``refs/<revision>``), or None without that ref."""
    ref = _repo_dir(repo_id, cache_dir) / "refs" / revision
    return ref.read_text() if ref.is_file() else None


def _repo_dir(repo_id: str, cache_dir: Path | None) -> Path:
    return (cache_dir or hub_cache_dir()) / f"models--{repo_id.replace('/', '--')}"


def download_hint(repo_id: str, revision: str) -> str:
    """The command that puts a model's config.json in the cache (a few KB; no weights)."""
    pin = "" if revision == "main" else f" --revision {revision}"
    return f"hf download {repo_id} config.json{pin}"
