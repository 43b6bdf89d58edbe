"""Runs under the JAX venv (tests/tpu_inference/conftest.py: run_jax): several helper scripts in one process, in the
order given, each as its own `python script.py` would (run as __main__, its payload on stdin, its last stdout line
its answer). The JAX stack's import (13 to 17 s of CPU) is paid once instead of once per script.

Only scripts that leave nothing another reads belong together (no environment set, no patch, no JAX setting, no
vLLM plugin load); the caller puts a script that reads the launch environment (jax_facts.py) first, before any
other imports the stack.

stdin: {"runs": [[script file path relative to this directory, payload], ...]}
stdout (last line): {"answers": [answer, ...]}
"""

import contextlib
import io
import json
import runpy
import sys
from pathlib import Path


def answer(script: str, payload: dict) -> dict:
    out = io.StringIO()
    sys.stdin = io.StringIO(json.dumps(payload))
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(Path(__file__).parent / script), run_name="__main__")
    finally:
        sys.stdin = sys.__stdin__
    return json.loads(out.getvalue().strip().splitlines()[-1])


runs = json.load(sys.stdin)["runs"]
print(json.dumps({"answers": [answer(script, payload) for script, payload in runs]}))
