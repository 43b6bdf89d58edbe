"""Under the JAX venv: the KV block size tpu-inference 0.32 gives each entry (stdin: {"entries": [Entry.to_dict()],
"pages": [[max_model_len, max_num_seqs], ...]}), one JSON line out.

"engine": per entry name, CacheConfig.block_size after vLLM's create_engine_config, which runs
TpuPlatform.check_and_update_config, and then the platform's update_block_size_for_backend, which vLLM's executors
run once the model is loaded (where upstream aligns a hybrid model's block size with its mamba state), in the
environment an aotc build gives the engine (the runner process's runner_env, then the engine's runtime_env);
"hybrid": per entry name, vLLM's ModelConfig.is_hybrid (attention beside mamba-type layers);
"pages": per case, PallasAttentionBackend.get_page_size and get_min_page_size; "mla_page": the MLA backend's.
"""

import json
import os
import sys
import tempfile
from types import SimpleNamespace

from pydantic import TypeAdapter

from aotc.runners.protocol import WireEntry
from aotc.runners.spec import load_runner
from aotc.runners.tpu_inference.engine import ENGINE, engine_args
from aotc.runners.vllm_engine import apply_env, llm_args


def engine_config(entry, cache_dir: str):
    """The entry's VllmConfig with its block size final, as the engine core starts with it."""
    apply_env(load_runner(entry.runner).runner_env(entry, os.environ))
    apply_env(ENGINE.runtime_env(entry, cache_dir))
    from vllm import EngineArgs
    from vllm.platforms import current_platform

    config = EngineArgs(**llm_args(engine_args(entry)), skip_tokenizer_init=True).create_engine_config()
    current_platform.update_block_size_for_backend(config)
    return config


def backend_pages(cases: list[list[int]]) -> list[list[int]]:
    from tpu_inference.layers.vllm.backends.flash_attn import PallasAttentionBackend

    pages = []
    for max_model_len, max_num_seqs in cases:
        config = SimpleNamespace(model_config=SimpleNamespace(max_model_len=max_model_len),
                                 scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs))
        pages.append([PallasAttentionBackend.get_page_size(config), PallasAttentionBackend.get_min_page_size(config)])
    return pages


def main() -> None:
    payload = json.loads(sys.stdin.read())
    entries = [TypeAdapter(WireEntry).validate_python(e) for e in payload["entries"]]
    with tempfile.TemporaryDirectory(prefix="aotc-block-size-") as cache_dir:
        configs = {e.name: engine_config(e, cache_dir) for e in entries}
    from tpu_inference.layers.vllm.backends.flash_attn_mla import PallasMLAttentionBackend

    print(json.dumps({"engine": {name: config.cache_config.block_size for name, config in configs.items()},
                      "hybrid": {name: config.model_config.is_hybrid for name, config in configs.items()},
                      "pages": backend_pages(payload["pages"]),
                      "mla_page": PallasMLAttentionBackend.get_page_size(None)}))


if __name__ == "__main__":
    main()
