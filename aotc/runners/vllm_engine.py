"""An entry's vLLM engine, as the vLLM-based runners (vllm_tpu, tpu_inference) start it: the process environment
in its two layers, the engine arguments, and the in-process launch. ``VllmEngine`` holds the skeleton once; a
backend subclasses it with what its stack differs in (as vLLM's platforms subclass ``Platform``).

The environment's two layers (``None`` = unset; set before the stack is imported: it reads it at import):
- serving: what a pod's stock ``vllm serve`` process holds besides the matrix's env (``serving_env``);
- runtime: the serving layer plus what aotc's own build and verify process adds (``runtime_env``).
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from aotc.engine_args import POD_ONLY_ARGS
from aotc.entry import Entry
from aotc.processes import update_env
from aotc.runners.multimodal import entry_is_multimodal
from aotc.runners.twin_flag import TWIN_FLAG

Env = dict[str, str | None]

# What every pod's server holds, whatever the stack: no usage reports leave a build host or a pod.
NO_TELEMETRY: Env = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
# aotc's in-process engine: one process to measure, and the runner's worker (its records, its jits) reachable
# from here.
IN_PROCESS: Env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def apply_env(env: Env) -> None:
    """Set each variable in this process; ``None`` unsets it."""
    update_env(os.environ, env)


def entry_engine_args(entry: Entry, model: str, local: bool, seed: int, **runner_args: Any) -> dict[str, Any]:
    """vLLM engine arguments for an entry, shared by aotc's in-process engine and the stock ``vllm serve``
    (aotc/server.py): its shapes and dtype, dummy weights, then the runner's own arguments, then the matrix's
    ``engine:`` (last, so an entry can override any of them)."""
    args: dict[str, Any] = {
        "model": model,
        "max_model_len": entry.max_model_len,
        "max_num_seqs": entry.max_num_seqs,
        "max_num_batched_tokens": entry.max_num_batched_tokens,
        "tensor_parallel_size": entry.tensor_parallel_size,
        "dtype": entry.dtype,
        # Graphs depend on shapes and dtypes, never on weight values.
        "load_format": "dummy",
        "seed": seed,
        **runner_args,
    }
    if not local and entry.revision:
        args["revision"] = entry.revision
    args.update(copy.deepcopy(entry.engine))  # the caller may edit the arguments; the entry is frozen
    return args


def llm_args(args: dict[str, Any]) -> dict[str, Any]:
    """The arguments an in-process ``LLM(...)`` takes: ``vllm serve``'s front-end settings (a pod's host,
    its served names, its logging) belong to the server alone and change no graph. Imports vLLM."""
    import dataclasses

    from vllm import EngineArgs

    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    return {key: value for key, value in args.items() if key in fields and key not in POD_ONLY_ARGS}


class VllmEngine:
    """One vLLM-based stack's engine for an entry. The public methods are the skeleton both backends share; the
    hooks under them (each defaulting to "nothing of its own") are what a backend overrides."""

    # The stock server's seed.
    serve_seed: ClassVar[int] = 0

    # --- the skeleton -----------------------------------------------------------------------------------

    def serving_env(self, entry: Entry, cache_dir: str, environ: Mapping[str, str] | None = None) -> Env:
        """What a pod (the stock ``vllm serve``) needs besides the matrix's env: None = unset. ``environ`` is the
        environment the server starts from (default: this process's)."""
        environ = os.environ if environ is None else environ
        self.check(entry)
        env: Env = {"VLLM_XLA_CACHE_PATH": cache_dir, **NO_TELEMETRY}
        if self.local_model(entry):
            env["HF_HUB_OFFLINE"] = "1"
        env.update(self.stack_env(entry, cache_dir))
        # unset on a TPU host whatever the caller's environment holds: the twin never activates on a real TPU
        env[TWIN_FLAG] = "1" if entry.device == "cpu" else None
        env.update(self.device_env(entry, environ))
        return env

    def runtime_env(self, entry: Entry, cache_dir: str, environ: Mapping[str, str] | None = None) -> Env:
        """Variables to set (None = unset) before vLLM is imported, for aotc's in-process build and verify: the
        pod's settings, then the in-process engine's."""
        environ = os.environ if environ is None else environ
        return {**self.serving_env(entry, cache_dir, environ), **IN_PROCESS, **self.in_process_env(entry, environ)}

    def engine_args(self, entry: Entry, seed: int) -> dict[str, Any]:
        """The in-process engine's arguments. The KV block count (a shape in every backbone graph) comes
        pinned in the entry's engine arguments (aotc/fingerprint.py: pin_kv), so build, verify and pods agree."""
        local = self.local_model(entry)
        return entry_engine_args(entry, local or entry.model, bool(local), seed, **self.runner_args(entry))

    def serve_settings(self, entry: Entry, cache_dir: str) -> tuple[dict[str, Any], Env]:
        """RunnerSpec.serve: the stock ``vllm serve``'s engine arguments and environment for this entry: the
        build's, each runner argument the server's own value (``serve_runner_args``) or none."""
        args = self.engine_args(entry, self.serve_seed)
        served = self.serve_runner_args(entry)
        for key in self.runner_args(entry):
            if key in served:
                args[key] = served[key]
            else:
                del args[key]
        return args, self.serving_env(entry, cache_dir)

    def start_engine(self, entry: Entry, cache_dir: str, seed: int,
                     before_start: Callable[[], None] | None = None) -> tuple[Any, float]:
        """Start vLLM in-process; returns (llm, seconds). ``before_start`` runs after the env is set and the
        backend has prepared this process (``prepare``)."""
        apply_env(self.runtime_env(entry, cache_dir))
        self.prepare(entry)
        if before_start is not None:
            before_start()
        started = time.perf_counter()
        from vllm import LLM

        # Prompts are token ids here; the tokenizer changes no graph. A multimodal model's input processor needs
        # it (it expands each image placeholder to the image's tokens): vLLM refuses skip_tokenizer_init there.
        llm = LLM(**llm_args(self.engine_args(entry, seed)), skip_tokenizer_init=not entry_is_multimodal(entry),
                  disable_log_stats=True)
        return llm, time.perf_counter() - started

    # --- the hooks a backend overrides --------------------------------------------------------------------

    def check(self, entry: Entry) -> None:
        """ValueError: an entry this stack cannot start."""
        if entry.device not in ("cpu", "tpu"):
            raise ValueError(f"unknown device {entry.device!r}")

    def local_model(self, entry: Entry) -> str | None:
        """The local model dir, as the matrix resolved it (relative paths are relative to the config, not to this
        process's cwd); None: a Hub model."""
        return entry.model_path

    def stack_env(self, entry: Entry, cache_dir: str) -> Env:
        """The stack's own serving variables, on either device."""
        return {}

    def device_env(self, entry: Entry, environ: Mapping[str, str]) -> Env:
        """The serving variables of the entry's device: the twin's on `cpu`, a TPU host's on `tpu`."""
        return {}

    def in_process_env(self, entry: Entry, environ: Mapping[str, str]) -> Env:
        """What aotc's build and verify process holds beyond a pod's and ``IN_PROCESS``."""
        return {}

    def runner_args(self, entry: Entry) -> dict[str, Any]:
        """The runner's engine arguments for the in-process engine."""
        return {}

    def serve_runner_args(self, entry: Entry) -> dict[str, Any]:
        """The stock server's value of each of ``runner_args``; one left out is not passed (the stack's default)."""
        return {}

    def prepare(self, entry: Entry) -> None:
        """Set this process up for the stack after the env is set, before vLLM is imported."""
