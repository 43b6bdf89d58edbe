"""The fingerprint: a sha256 over everything that changes a compiled graph or its cache key.

Read without importing the heavy packages: versions come from package metadata, flags from the
environment, model facts from the config. Two machines with the same inputs compute the same digest;
change any one input and the digest changes, so a pod never loads a cache built for another stack.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from aotc import kv
from aotc.engine_args import graph_args
from aotc.entry import MODEL_FILES, Entry, hf_config
from aotc.errors import BadInput
from aotc.files import canonical_json, sha256_file
from aotc.hf_cache import cached_commit
from aotc.runners.flags import xla_flags
from aotc.runners.spec import runner_versions

# 2: flags hashed as JAX hashes them (every word, duplicates kept, the stack's own additions once per
#    process of a stock server); the pinned KV block count; versions from the runner's pins without its venv.
# 3: the stack's own additions once in every process layout (aotc's vLLM plugin collapses them).
FINGERPRINT_VERSION = 3


@dataclass(frozen=True)
class Fingerprint:
    digest: str
    inputs: dict[str, Any]

    @property
    def short(self) -> str:
        return self.digest[:12]


def digest_of(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(inputs)).hexdigest()


def code_digest(modules: tuple[str, ...]) -> str:
    """sha256 over the modules' source files (a package's: every module in it), found by path and never
    imported (a twin module imports its stack). The bytes, not a parse: the guard and the runner compute this
    under other Python versions."""
    lines = (f"{name} {sha256_file(path)[0]}\n" for module in modules for name, path in source_files(module))
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def source_files(module: str) -> list[tuple[str, str]]:
    """(module name, source path) of a module, or of each module of a package (its subpackages' too), by name."""
    spec = importlib.util.find_spec(module)
    if spec.submodule_search_locations is None:
        return [(module, spec.origin)]
    root = Path(spec.origin).parent
    files = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        files.append((".".join((module, *(parts[:-1] if parts[-1] == "__init__" else parts))), str(path)))
    return files


def twin_digest(entry: Entry) -> str | None:
    """The CPU twin's code in the entry's graphs (``RunnerSpec.twin_package``); None off the twin."""
    package = entry.backend.twin_package
    return code_digest((package,)) if entry.device == "cpu" and package else None


def local_model_inputs(name: str, model_dir: Path) -> dict[str, Any]:
    """A local model or draft as the fingerprint knows it: by ``name`` (its dir's), not where it lies, and by the
    sha256 of each file of it a plan reads (``MODEL_FILES``): config.json's as ``model_config_sha256``, the
    others the dir has under ``model_files_sha256`` (absent with none, so a text model's inputs are as before)."""
    digests = {file: sha256_file(str(model_dir / file))[0] for file in MODEL_FILES if (model_dir / file).is_file()}
    inputs = {"model": name, "model_config_sha256": digests.pop("config.json")}
    if digests:
        inputs["model_files_sha256"] = digests
    return inputs


def model_inputs(entry: Entry) -> dict[str, Any]:
    path = entry.model_config_path
    if path is None or not path.is_file():
        return {"model": entry.model, "model_config_sha256": None}
    return local_model_inputs(os.path.basename(entry.model.rstrip("/")), path.parent)


def engine_inputs(engine: dict[str, Any]) -> dict[str, Any]:
    """Every engine argument that can change a graph (``graph_args``) but the KV block count (it is ``kv_blocks``: an
    entry that pins the count the stack sized has the sized entry's fingerprint); a local speculative draft (the
    matrix made its path absolute) known as ``local_model_inputs`` knows the target."""
    args = {k: v for k, v in graph_args(engine).items() if k != kv.OVERRIDE}
    spec = args.get("speculative_config")
    draft = spec.get("model") if isinstance(spec, dict) else None
    if isinstance(draft, str) and os.path.isabs(draft) and (Path(draft) / "config.json").is_file():
        args["speculative_config"] = {**spec, **local_model_inputs(os.path.basename(draft.rstrip("/")), Path(draft))}
    return args


# A Hugging Face commit: the one revision whose files cannot change under the same name.
COMMIT_RE = re.compile(r"[0-9a-f]{40}")


def unpinned_hub_models(entry: Entry) -> list[str]:
    """Each hub model the entry's runner loads (the model, a speculative draft) at a branch or tag rather than a
    commit, as a one-line reason. A pod's vLLM loads whatever that revision names when it starts, and neither the
    fingerprint nor an init container (no Hugging Face cache) can know which commit that is."""
    if not entry.backend.loads_models:
        return []
    found = [] if entry.model_path else [("revision", entry.model, entry.revision)]
    spec = entry.engine_mapping("speculative_config")
    draft = spec.get("model") if isinstance(spec, dict) else None
    if isinstance(draft, str) and not os.path.isabs(draft):
        found.append(("engine.speculative_config.revision", draft, spec.get("revision")))
    return [f"{entry.name}: {key}: hub model {model} at {repr(revision) if revision else 'its default branch'}, "
            "not a commit: a pod's vLLM loads whatever that names when it starts, which no fingerprint can know; "
            "pin the commit (40 hex digits)" + _cached_commit_hint(model, str(revision or "main"))
            for key, model, revision in found if not COMMIT_RE.fullmatch(str(revision or ""))]


def _cached_commit_hint(model: str, revision: str) -> str:
    commit = cached_commit(model, revision)
    return f" ({revision!r} names {commit} in this machine's Hugging Face cache)" if commit else ""


def require_pinned(entries: list[Entry]) -> None:
    for entry in entries:
        if problems := unpinned_hub_models(entry):
            raise BadInput(problems[0])


_SIZED = object()


def entry_kv_blocks(entry: Entry, environ: dict[str, str] | None = None, *, size: bool = True) -> int | None:
    """The KV block count the entry pins; None for a runner that pins none. The matrix's override, else the
    runner's ``kv_blocks``: the stack's own sizing, kept per every other fingerprint input (aotc/kv.py), or its
    rule (by default the full-length one). ``size=False``: never start the stack (an init container has neither
    it nor the accelerator); a sizing not on disk raises ``KvNotSized``."""
    if (pinned := kv.override(entry)) is not None:
        return pinned
    environ = dict(os.environ if environ is None else environ)
    if entry.backend.kv_sizing_inputs(environ) is not None:
        return kv.stack_kv_blocks(entry, environ, kv_sizing_key(entry, environ), size=size)
    return entry.backend.kv_blocks(entry, environ)


def kv_sizing_key(entry: Entry, environ: dict[str, str]) -> dict[str, Any]:
    """What the stack's sizing answers: every fingerprint input but the count, and the variables it reads."""
    return {"inputs": fingerprint_inputs(entry, environ, kv_blocks=None), **entry.backend.kv_sizing_inputs(environ)}


def pin_kv(entry: Entry, environ: dict[str, str] | None = None, kv_blocks: int | None = None) -> Entry:
    """The entry with its KV block count written into its engine arguments, as build, verify and the stock
    server pass it (``kv_blocks``: a count already known, e.g. a manifest's)."""
    blocks = kv_blocks if kv_blocks is not None else entry_kv_blocks(entry, environ)
    if blocks is None or kv.override(entry) == blocks:
        return entry
    return replace(entry, engine={**entry.engine, kv.OVERRIDE: blocks})


def fingerprint_inputs(entry: Entry, environ: dict[str, str] | None = None, kv_blocks: Any = _SIZED) -> dict[str, Any]:
    """``kv_blocks``: the KV block count when it is known otherwise (the running engine's, a manifest's);
    by default the entry's (aotc/kv.py: the matrix's override, else the stack's sizing)."""
    environ = dict(os.environ if environ is None else environ)
    inputs = {
        "fingerprint_version": FINGERPRINT_VERSION,
        **model_inputs(entry),
        # a hub model's files are named by it, a commit (fingerprint_entry refuses a branch)
        "revision": entry.revision,
        "runner": entry.runner,
        "device": entry.device,
        "accelerator": entry.accelerator,
        "dtype": entry.dtype,
        "max_model_len": entry.max_model_len,
        "max_num_seqs": entry.max_num_seqs,
        "max_num_batched_tokens": entry.max_num_batched_tokens,
        "tensor_parallel_size": entry.tensor_parallel_size,
        # every vllm serve argument the matrix set, but those a pod chooses freely (aotc/engine_args.py)
        "engine": engine_inputs(entry.engine),
        # a shape in every backbone graph; the serving flags pin it (aotc/server.py)
        "kv_blocks": entry_kv_blocks(entry, environ) if kv_blocks is _SIZED else kv_blocks,
        "env": entry.backend.runner_env(entry, environ),
        "versions": runner_versions(entry.runner, environ),
        "xla_flags": xla_flags(environ, entry.runner, entry_flags=entry.backend.planner.implied_flags(entry)),
    }
    if (mesh := entry.backend.planner.mesh(entry)) is not None:
        inputs["mesh"] = mesh
    if (twin := twin_digest(entry)) is not None:
        inputs["twin"] = twin
    # a hub model's config only where the matrix ships it: an init container has no Hugging Face cache, and
    # the key must be the one the build machine (which has it) computed
    if fixes := entry.backend.planner.serving_fixes(entry, hf_config(entry) if entry.model_path else None):
        inputs["serving_fixes"] = code_digest(fixes)
    return inputs


def fingerprint_entry(entry: Entry, environ: dict[str, str] | None = None, kv_blocks: Any = _SIZED) -> Fingerprint:
    """The digest that names an artifact: refused (exit 2) for a hub model at a branch (``unpinned_hub_models``).
    The guard, which describes a running server, calls ``fingerprint_inputs`` and names such a difference."""
    require_pinned([entry])
    inputs = fingerprint_inputs(entry, environ, kv_blocks)
    return Fingerprint(digest_of(inputs), inputs)


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: data}


def diff_inputs(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Dotted key paths whose values differ between two input sets (missing counts as different)."""
    fa, fb = flatten(a), flatten(b)
    return sorted(k for k in fa.keys() | fb.keys() if fa.get(k, _MISSING) != fb.get(k, _MISSING))


def describe_diff(ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    fa, fb = flatten(ours), flatten(theirs)
    return [f"{k}: here {fa.get(k, '<unset>')!r}, published {fb.get(k, '<unset>')!r}" for k in diff_inputs(ours, theirs)]


_MISSING = object()
