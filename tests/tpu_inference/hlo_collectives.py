"""Runs under the JAX venv: the collectives in each compiled program of a JAX cache dir, read from the
executables themselves (deserialized on as many virtual CPU devices as the mesh, HLO text of the module).

stdin: {"cache_dir": DIR, "devices": N}
stdout (last line): {"<file>": ["all-reduce", ...], ...}
"""

import json
import os
import re
import sys
from pathlib import Path

request = json.load(sys.stdin)
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={request['devices']}"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
from jax._src import compilation_cache, xla_bridge  # noqa: E402
from jax._src.lib import xla_client  # noqa: E402

COLLECTIVE = re.compile(r"= \S+ (all-reduce|all-gather|reduce-scatter|collective-permute|all-to-all)(?:-start)?\(")
backend = xla_bridge.get_backend("cpu")
devices = xla_client.DeviceList(tuple(jax.devices()[:request["devices"]]))
found = {}
for path in sorted(Path(request["cache_dir"]).glob("jit_*-cache")):
    serialized, _ = compilation_cache.extract_executable_and_time(
        compilation_cache.decompress_executable(path.read_bytes()))
    try:
        executable = backend.deserialize_executable(serialized, devices, xla_client.CompileOptions())
    except Exception:  # a program compiled for fewer devices (e.g. one-device helpers) loads elsewhere
        continue
    text = "\n".join(m.to_string() for m in executable.hlo_modules())
    found[path.name] = sorted({m.group(1) for m in COLLECTIVE.finditer(text)})
print(json.dumps(found))
