"""python -m aotc.runners.tpu_inference {build|verify} REQUEST.json RESULT.json (aotc/runners/protocol.py).

Runs under the JAX venv's interpreter (AOTC_PYTHON_TPU_INFERENCE), never the core's.
"""

from __future__ import annotations

from aotc.runners.protocol import BuildResult, Mode, Request, VerifyResult, runner_main
from aotc.processes import exit_now


def run(mode: Mode, request: Request) -> BuildResult | VerifyResult:
    if mode == "build":
        from .build import run_build

        return run_build(request)
    from .verify import run_verify

    return run_verify(request)


if __name__ == "__main__":
    exit_now(runner_main("python -m aotc.runners.tpu_inference", run))
