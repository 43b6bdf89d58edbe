"""One measured engine: env set, probe and instrumentation installed, vLLM started, traffic driven."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Any

from aotc.fingerprint import xla_flags
from aotc.matrix import Entry
from aotc.runners import traffic

from . import buckets, engine, instrument, twin_plugin
from .probe import Probe

RUNNER = "tpu-inference"
# Sampling parameters vLLM rejects with speculative decoding (SamplingParams / the input processor's checks)
SPECULATIVE_REJECTS = ("min_p", "prompt_logprobs")


@dataclass
class Session:
    llm: Any
    probe: Probe
    start_seconds: float
    entry: dict[str, Any]

    @classmethod
    def start(cls, entry: dict[str, Any], cache_dir: str) -> Session:
        probe = Probe()

        def hook() -> None:
            # The twin must patch tpu-inference before instrument imports its runner (a no-op on TPU).
            twin_plugin.register()
            probe.install()
            instrument.install(probe)

        llm, seconds = engine.start_engine(entry, cache_dir, before_start=hook)
        instrument.PROGRESS.flush()
        probe.enter_phase("runtime")
        return cls(llm, probe, seconds, entry)

    def drive_traffic(self, seed: int, requests: int) -> int:
        p = buckets.paddings_for(self.entry)
        limits = traffic.Limits.of(self.entry, p["reqs"], prompt_logprob_buckets=p["tokens"],
                                   token_buckets=p["tokens"])
        batches = traffic.plan_traffic(seed, requests, limits, engine.vocab_size(self.llm))
        entry = Entry.from_dict(self.entry)
        if buckets.speculative_config(entry):
            batches = without_params(batches, SPECULATIVE_REJECTS)
        sent = traffic.run_traffic(self.llm, batches)
        if reach := structured_sizes(entry):
            sent += run_structured(self.llm, random.Random(seed), reach, engine.vocab_size(self.llm))
        return sent

    def records(self) -> list[dict[str, Any]]:
        return self.probe.snapshot()


def structured_sizes(entry: Entry) -> list[int]:
    """Batch sizes that reach each structured-decoding graph tpu-inference's warm-up skips (buckets.beyond_warmup):
    one batch per request bucket, as many requests as the bucket holds and the engine runs at once."""
    most = buckets.data_parallel_size(entry) * entry.max_num_seqs
    return sorted({min(g.shape_dict["num_reqs"], most) for g in buckets.beyond_warmup(entry)
                   if g.family == "structured_decoding"})


def run_structured(llm, rng: random.Random, sizes: list[int], vocab: int) -> int:
    """Structured-output requests (a grammar mask on every step's logits), one batch per size."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    params = SamplingParams(max_tokens=traffic.STEP_NEW_TOKENS, temperature=0.0,
                            structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))
    for size in sizes:
        prompts = [{"prompt_token_ids": [rng.randrange(3, vocab) for _ in range(4)]} for _ in range(size)]
        llm.generate(prompts, [params] * size, use_tqdm=False)
    return sum(sizes)


def without_params(batches: list[list[traffic.Request]], names: tuple[str, ...]) -> list[list[traffic.Request]]:
    """The same requests without the named sampling parameters (the rest of the sweep keeps its seed)."""
    return [[traffic.Request(r.prompt, {k: v for k, v in r.sampling.items() if k not in names}) for r in batch]
            for batch in batches]


def effective_flags() -> list[str]:
    """The flags this process compiles with, as JAX hashes them (tpu-inference's additions included)."""
    return xla_flags(dict(os.environ), imports=0)
