"""python -m tests.helpers.guard_engine ENTRY.json CACHE_DIR

Starts vLLM on the CPU twin with VLLM_XLA_CACHE_PATH=CACHE_DIR, through the vllm-tpu runner's engine: the
worker is aotc's measuring CPU-twin worker (the CPU needs it), not the stock TPUWorker a pod runs after
``aotc fetch``. Then it sends one batch mixing greedy and random sampling: capture_model never traces that
sampler variant, so it compiles after ready. Prints one marked JSON line with the outcome;
the guard's log lines go to stderr with vLLM's.
"""

from __future__ import annotations

import json
import os
import sys

from aotc.entry import Entry

OUTCOME = "AOTC_TEST_OUTCOME "  # vLLM logs to stdout too: the outcome line is marked

def main() -> int:
    entry_path, cache_dir = sys.argv[1:3]
    with open(entry_path) as f:
        entry = Entry.from_dict(json.load(f))
    from aotc.runners.vllm_tpu import engine

    llm, _ = engine.start_engine(entry, cache_dir, seed=0)
    from vllm import SamplingParams

    prompts = [{"prompt_token_ids": [5 + i, 6, 7]} for i in range(3)]
    params = [SamplingParams(max_tokens=2, ignore_eos=True, detokenize=False,
                             temperature=0.0 if i % 2 == 0 else 0.8) for i in range(3)]
    try:
        outputs = llm.generate(prompts, params, use_tqdm=False)
        outcome = {"raised": None, "finish_reasons": [o.outputs[0].finish_reason for o in outputs]}
    except Exception as exc:  # the guard must never make the engine raise
        outcome = {"raised": f"{type(exc).__name__}: {exc}", "finish_reasons": []}
    print(OUTCOME + json.dumps(outcome), flush=True)
    sys.stderr.flush()
    os._exit(0)  # vLLM's in-process engine can hang in interpreter teardown


if __name__ == "__main__":
    sys.exit(main())
