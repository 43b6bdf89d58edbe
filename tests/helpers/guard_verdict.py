"""python -m tests.helpers.guard_verdict REQUEST.json

The guard's start-up verdict on a real VllmConfig, as a pod's engine core reaches it, without starting an
engine: vLLM's own AsyncEngineArgs (whose ``__post_init__`` loads the general plugins, the guard among them,
with AOTC_GUARD set) makes the config through ``create_engine_config``, and the guard's session checks it
against each cache dir as ``EngineCore._initialize_kv_caches`` would. REQUEST: ``{"args": {...}, "caches":
[...]}``. Prints one marked JSON line: per cache dir, the verdict and its differing inputs.
"""

from __future__ import annotations

import json
import sys

from tests.helpers.guard_engine import OUTCOME


def main() -> int:
    with open(sys.argv[1]) as f:
        request = json.load(f)
    from vllm.engine.arg_utils import AsyncEngineArgs

    config = AsyncEngineArgs(**request["args"]).create_engine_config()
    from aotc import guard

    verdicts = []
    for cache in request["caches"]:
        guard._session.start(config, cache)
        verdicts.append({"status": guard._session.check.status, "differences": list(guard._session.check.differences)})
    print(OUTCOME + json.dumps(verdicts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
