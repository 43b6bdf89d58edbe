"""One measured engine: env set, probe and instrumentation installed, vLLM started, traffic driven."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from aotc.entry import Entry, hf_config
from aotc.runners import traffic
from aotc.runners.flags import xla_flags
from aotc.runners.multimodal import with_images
from aotc.runners.records import Record

from . import beyond_warmup, compile_only, engine, instrument, plugin
from .plan import buckets
from .probe import Probe

RUNNER = "tpu-inference"
# Sampling parameters vLLM rejects with speculative decoding (SamplingParams / the input processor's checks)
SPECULATIVE_REJECTS = ("min_p", "prompt_logprobs")


@dataclass
class Session:
    llm: Any
    probe: Probe
    start_seconds: float
    entry: Entry

    @classmethod
    def start(cls, entry: Entry, cache_dir: str, plan: list[dict[str, Any]] = ()) -> Session:
        """``plan``: the request's graphs; those marked beyond_warmup are compiled after the stack's own."""
        probe = Probe()

        def hook() -> None:
            # The twin must patch tpu-inference before instrument imports its runner (a no-op on TPU).
            plugin.register()
            probe.install()
            if compile_only.installed():
                compile_only.on_target_compile.append(lambda executable: probe.record_compile(
                    compile_only.memory_figures(executable)))
            instrument.install(probe)
            beyond_warmup.install(plan)

        llm, seconds = engine.start_engine(entry, cache_dir, before_start=hook)
        instrument.PROGRESS.flush()
        probe.enter_phase("runtime")
        return cls(llm, probe, seconds, entry)

    @property
    def compile_only(self) -> bool:
        """Compiled for a TPU this host does not have: nothing it compiled can run, so no traffic is served."""
        return compile_only.installed()

    def drive_traffic(self, seed: int, requests: int) -> int:
        return 0 if self.compile_only else drive_traffic(self.llm, self.entry, seed, requests)

    def records(self) -> list[Record]:
        return self.probe.snapshot()


def drive_traffic(llm: Any, entry: Entry, seed: int, requests: int) -> int:
    """The seeded sweep (aotc/runners/traffic.py) through ``llm``, an engine started for ``entry``."""
    p = buckets.paddings(entry)
    images = buckets.traffic_images(entry, hf_config(entry))
    # vLLM rejects prompt logprobs for a multimodal model
    limits = traffic.Limits.of(entry, p["reqs"], prompt_logprob_buckets=() if images else p["tokens"],
                               token_buckets=p["tokens"])
    limits = with_images(limits, entry, images, llm)
    batches = traffic.plan_traffic(seed, requests, limits, engine.vocab_size(llm))
    if buckets.speculative_config(entry):
        batches = without_params(batches, SPECULATIVE_REJECTS)
    return traffic.run_traffic(llm, batches)


def without_params(batches: list[list[traffic.TrafficRequest]],
                   names: tuple[str, ...]) -> list[list[traffic.TrafficRequest]]:
    """The same requests without the named sampling parameters (the rest of the sweep keeps its seed)."""
    return [[traffic.TrafficRequest(r.prompt, {k: v for k, v in r.sampling.items() if k not in names}) for r in batch]
            for batch in batches]


def effective_flags() -> list[str]:
    """The flags this process compiles with, as JAX hashes them (tpu-inference's additions included)."""
    return xla_flags(dict(os.environ))
