"""The matrix's ``engine:``: any ``vllm serve`` argument, checked by the serving stack's own parser.

A key is an argument name as vLLM spells it in Python (``max_loras``; ``max-loras`` is taken too) and its
value what YAML gives (scalars, lists, mappings for JSON arguments such as ``speculative_config``). Which
names exist and which values they take is the stack's word: ``aotc/runners/serve_args.py`` runs
``vllm serve``'s argparse in the runner's interpreter. Its verdicts are kept on disk per interpreter,
versions and flags, so only a new matrix pays the stack's import. Where the runner's interpreter has no
vLLM at all (an init container that only fetches), nothing is checked: the build already was.

Every argument enters the fingerprint except the pod-only ones below, which change no graph and no key.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from aotc.errors import BadInput
from aotc.files import aotc_home, answer_path, keep_answer, kept_answer

# Settings a pod chooses freely: where it listens, who may call it, what it calls its model, how it logs.
# None changes a compiled graph or its cache key, so none enters the fingerprint (docs/design.md).
POD_ONLY_ARGS = frozenset({
    "host", "port", "uds", "api_key", "served_model_name", "root_path", "middleware",
    "allowed_origins", "allowed_methods", "allowed_headers", "allow_credentials",
    "ssl_keyfile", "ssl_certfile", "ssl_ca_certs", "ssl_cert_reqs", "enable_ssl_refresh",
    "uvicorn_log_level", "disable_uvicorn_access_log", "disable_log_requests", "enable_log_requests",
    "enable_log_outputs", "disable_log_stats", "max_log_len", "disable_fastapi_docs",
    "enable_request_id_headers", "enable_server_load_tracking", "h11_max_incomplete_event_size",
    "h11_max_header_count", "log_error_stack", "lora_modules",
})
# Arguments aotc sets itself from the matrix's own keys (axes, dtype, model); the matrix says them there.
OWN_KEYS = frozenset({"model", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size",
                      "dtype", "revision", "seed", "load_format"})
# vllm serve's --config: a YAML file of more arguments, read by the server's parser alone. The build would not
# apply them and the fingerprint would hash a path, so the matrix takes the arguments themselves.
ARGUMENT_FILES = frozenset({"config"})
CHECK_TIMEOUT = 300
# What runs vllm serve's parser in the runner's interpreter (read, never imported here: it imports vLLM)
CHECKER = Path(__file__).parent / "runners" / "serve_args.py"


def normalize(key: str) -> str:
    """``max-loras`` and ``max_loras`` are one argument, as vLLM's parser reads them."""
    return key.strip().lstrip("-").replace("-", "_")


def graph_args(engine: dict[str, Any]) -> dict[str, Any]:
    """The engine arguments that can change a graph or its key: all but the pod-only ones, sorted."""
    return {k: engine[k] for k in sorted(engine) if k not in POD_ONLY_ARGS}


def decoded_json_args(engine: dict[str, Any]) -> dict[str, Any]:
    """vLLM's parser takes a JSON argument (``speculative_config``, ``compilation_config``, ``hf_overrides``, ...)
    as its JSON text too; decoded here, every reader (a local draft's path, the rules, the fingerprint) sees one
    form, the mapping, and ``cli_flags`` hands the server the same JSON back. Only a JSON object is decoded: no
    other argument takes one."""
    return {key: _json_object(value) for key, value in engine.items()}


def _json_object(value: Any) -> Any:
    if not (isinstance(value, str) and value.lstrip().startswith("{")):
        return value
    try:
        decoded = json.loads(value)
    except ValueError:
        return value
    return decoded if isinstance(decoded, dict) else value


def with_hf_overrides(config: dict[str, Any] | None, engine: dict[str, Any]) -> dict[str, Any] | None:
    """A model's config.json as vLLM sees it: ``hf_overrides`` (a mapping) replaces its fields, mappings
    merged key by key (vLLM's ``ModelConfig`` applies them before any rule reads the config)."""
    overrides = engine.get("hf_overrides")
    if config is None or not isinstance(overrides, dict):
        return config
    merged = dict(config)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def cli_flags(args: dict[str, Any]) -> list[str]:
    """vLLM's argparse spelling: ``max_model_len=128`` -> ``--max-model-len 128``; booleans as
    ``--x`` / ``--no-x``; mappings and lists as JSON; ``lora_modules`` one word per adapter. The stack's check
    and the stock server both get these words, so what plan accepts is what the server is given."""
    flags: list[str] = []
    for key, value in args.items():
        if value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if key == LORA_MODULES:
            words = lora_module_words(value)
            flags += [flag, *words] if words else []
        elif isinstance(value, bool):
            flags.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, (dict, list)):
            flags += [flag, json.dumps(value)]
        else:
            flags += [flag, str(value)]
    return flags


LORA_MODULES = "lora_modules"
# vLLM's LoRAModulePath: what one JSON word of --lora-modules holds
LORA_MODULE_FIELDS = frozenset({"name", "path", "base_model_name"})


def lora_module_words(value: Any) -> list[str]:
    """The matrix's ``lora_modules`` as ``vllm serve --lora-modules`` takes it, one word per adapter
    (vLLM's LoRAParserAction reads ``name=path`` or a JSON object). The matrix may give a mapping
    ``{name: path}``, one adapter object ``{name, path, base_model_name}``, one word, or a list of words and
    objects. Words pass as written: the stack's parser judges them."""
    if not value:
        return []
    if isinstance(value, dict) and not _is_lora_module(value):
        return [f"{name}={path}" for name, path in value.items()]
    items = value if isinstance(value, list) else [value]
    return [json.dumps(item) if isinstance(item, dict) else str(item) for item in items]


def lora_module_paths(value: Any) -> dict[str, str]:
    """name -> adapter path of the matrix's ``lora_modules`` (a matrix the stack's parser accepted), read from
    each word as vLLM's LoRAParserAction reads it."""
    paths = {}
    for word in lora_module_words(value):
        if "=" in word and "," not in word:
            name, _, path = word.partition("=")
        else:
            module = json.loads(word)
            name, path = module["name"], module["path"]
        paths[name] = path
    return paths


def _is_lora_module(mapping: dict) -> bool:
    return {"name", "path"} <= mapping.keys() <= LORA_MODULE_FIELDS


def stack_verdicts(python: str, versions: dict[str, Any], engines: Iterable[dict[str, Any]],
                   packages: Iterable[str] = ()) -> list[str | None]:
    """For each engine mapping, None when the stack's ``vllm serve`` accepts it, else its complaint (one
    line). All None when ``python`` has no vLLM, or lacks one of the stack's ``packages`` (another stack's vLLM,
    e.g. the core venv's 0.13 where tpu-inference's venv is not named, must not judge its arguments)."""
    argvs = [cli_flags(engine) for engine in engines]
    if not any(argvs):
        return [None] * len(argvs)
    packages = sorted(packages)
    cached = answer_path(_verdict_cache(), [os.path.realpath(python), versions, argvs, packages], CHECKER)
    verdicts = kept_answer(cached, lambda kept: _valid_verdicts(kept, len(argvs)))
    if verdicts is None:
        verdicts = _run_parser(python, argvs, packages)
        keep_answer(cached, verdicts)
    return verdicts


def _valid_verdicts(verdicts: Any, count: int) -> bool:
    """One verdict per engine mapping, each None (accepted) or the parser's complaint."""
    return isinstance(verdicts, list) and len(verdicts) == count and \
        all(v is None or isinstance(v, str) for v in verdicts)


def _run_parser(python: str, argvs: list[list[str]], packages: list[str]) -> list[str | None]:
    try:
        proc = subprocess.run([python, "-m", "aotc.runners.serve_args"],
                              input=json.dumps({"argvs": argvs, "packages": packages}),
                              capture_output=True, text=True, timeout=CHECK_TIMEOUT,
                              env={**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")})
        answer = json.loads(proc.stdout.strip().splitlines()[-1])
        verdicts = [None] * len(argvs) if "absent" in answer else [r["error"] for r in answer["results"]]
        if not _valid_verdicts(verdicts, len(argvs)):
            raise ValueError(verdicts)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError, KeyError, TypeError):
        raise BadInput(f"cannot run vllm serve's argument parser in {python} to check the matrix's engine "
                       "arguments (is the runner's venv installed? make env / make env-jax)") from None
    return verdicts


def _verdict_cache() -> Path:
    return aotc_home() / "engine-args"
