"""Under a runner's interpreter: the KV block count the stack's own functions give an entry at other twin HBM
figures.

stdin: {"runner": "tpu-inference" | "vllm-tpu", "entry": Entry.to_dict(), "hbm_bytes": [int, ...]}. Starts the
engine as aotc's sizing does (aotc/runners/kv_sizing.py), keeps the executor and the KV cache specs the engine
core sized with, then for each HBM figure asks the workers' own ``determine_available_memory`` and vLLM's own
``get_kv_cache_configs`` / ``generate_scheduler_kv_cache_config``.
stdout (last line): {"sized": N, "by_hbm": {"<bytes>": N, ...}}.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile


def main() -> None:
    request = json.load(sys.stdin)
    from aotc.entry import Entry
    from aotc.runners import kv_sizing

    package = "aotc.runners." + request["runner"].replace("-", "_")
    engine = importlib.import_module(package + ".engine")
    [hbm_env] = importlib.import_module(package + ".kv_sizer").SIZING_ENV
    seed = {"seed": 0} if request["runner"] == "vllm-tpu" else {}

    seen = {}

    def capture() -> None:  # nothing of the stack imported here: the twin installs before it
        from vllm.v1.engine import core

        # vLLM's own functions, as the engine core names them (they moved between vLLM 0.13 and 0.32)
        seen.update(get_kv_cache_configs=core.get_kv_cache_configs,
                    generate_scheduler_kv_cache_config=core.generate_scheduler_kv_cache_config)
        kv_sizing.stop_when_sized()
        initialize, configs = core.EngineCore._initialize_kv_caches, core.get_kv_cache_configs

        def initialize_and_keep(engine_core, vllm_config):
            seen["executor"] = engine_core.model_executor
            return initialize(engine_core, vllm_config)

        def configs_and_keep(vllm_config, specs, available):
            seen.update(vllm_config=vllm_config, specs=specs)
            return configs(vllm_config, specs, available)

        core.EngineCore._initialize_kv_caches = initialize_and_keep
        core.get_kv_cache_configs = configs_and_keep

    with tempfile.TemporaryDirectory() as cache_dir:
        try:
            engine.start_engine(Entry.from_dict(request["entry"]), cache_dir, before_start=capture, **seed)
        except kv_sizing.Sized as done:
            sized = done.num_blocks
    get_kv_cache_configs = seen["get_kv_cache_configs"]
    generate_scheduler_kv_cache_config = seen["generate_scheduler_kv_cache_config"]
    by_hbm = {}
    for hbm in request["hbm_bytes"]:
        os.environ[hbm_env] = str(hbm)
        available = seen["executor"].determine_available_memory()  # the workers', as the engine core asks
        configs = get_kv_cache_configs(seen["vllm_config"], seen["specs"], available)
        by_hbm[str(hbm)] = generate_scheduler_kv_cache_config(configs).num_blocks
    print(json.dumps({"sized": sized, "by_hbm": by_hbm}))


if __name__ == "__main__":
    main()
