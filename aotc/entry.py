"""One matrix entry as data (``Entry``): what the runner interface's hooks take, the core plans and fingerprints,
and a runner process receives (aotc/runners/protocol.py). A leaf below the interface: it imports no aotc module
but the leaves, so aotc/runners/spec.py can name it; aotc/matrix.py builds entries from the YAML and
re-exports it.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aotc.engine_args import with_hf_overrides
from aotc.files import read_regular_file
from aotc.hf_cache import cached_file

if TYPE_CHECKING:
    from aotc.runners.spec import RunnerSpec

MAX_CONFIG_JSON_BYTES = 64 << 20  # a model's config.json, with room for a vocabulary-sized label map
# The files of a model dir a plan reads (through Entry.model_json), so those the fingerprint hashes of a local
# model or draft: a file that changes the plan changes the set of graphs. tests/test_fingerprint.py holds every
# file a plan opens to this list.
MODEL_FILES = ("config.json", "preprocessor_config.json", "processor_config.json")


@dataclass(frozen=True)
class Entry:
    """One cell of the matrix: everything needed to plan, fingerprint and build one cache."""

    name: str
    model_name: str
    model: str
    revision: str
    runner: str
    device: str
    accelerator: str
    dtype: str
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    tensor_parallel_size: int
    engine: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)
    model_path: str | None = None  # absolute local directory when ``model`` is one

    def engine_mapping(self, name: str) -> dict[str, Any]:
        """An engine argument vllm serve takes as JSON, as a mapping (the matrix may give either); {} unset."""
        value = self.engine.get(name) or {}
        return json.loads(value) if isinstance(value, str) else value

    @functools.cached_property
    def backend(self) -> RunnerSpec:
        """The entry's runner, resolved once (``load_runner``); every hook the core calls goes through it."""
        from aotc.runners.spec import load_runner  # at run time only: the spec names Entry in its hooks' types

        return load_runner(self.runner)

    @property
    def model_config_path(self) -> Path | None:
        """A local model's config.json: part of the model, on every machine the matrix is."""
        return Path(self.model_path) / "config.json" if self.model_path else None

    @property
    def readable_config_path(self) -> Path | None:
        """The config.json this machine can read: a local model's, or a hub model's in the Hugging Face cache
        at the entry's revision (None when the cache lacks it: nothing here reaches the network)."""
        return self.model_config_path or cached_file(self.model, "config.json", self.revision)

    def model_json(self, name: str) -> dict[str, Any]:
        """A file of the model beside the config.json this machine reads (one of ``MODEL_FILES``: the fingerprint
        hashes those), as a mapping; {} where it has none."""
        if name not in MODEL_FILES:
            raise ValueError(f"{name}: not in MODEL_FILES, so not in a local model's fingerprint")
        config = self.readable_config_path
        path = config.parent / name if config is not None else None
        return json.loads(read_regular_file(path, MAX_CONFIG_JSON_BYTES)) \
            if path is not None and path.is_file() else {}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Entry:
        return cls(**data)


def hf_config(entry: Entry) -> dict | None:
    """The entry's config.json as vLLM sees it (with the entry's ``hf_overrides``), when this machine has it:
    a local model's, or a hub model's from the Hugging Face cache."""
    return with_hf_overrides(entry.model_json("config.json") or None, entry.engine)
