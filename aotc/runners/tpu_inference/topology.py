"""A matrix's ``accelerator`` as libtpu names the TPU topology, and that topology's compile-only devices.

libtpu compiles for a TPU it does not have: ``jax.experimental.topologies.get_topology_desc`` gives the
devices of a named topology, which lower and compile but never run. JAX's cache key hashes the topology's
fingerprint (``cache_key._hash_accelerator_config``), and that fingerprint depends on how the chips are split
into hosts (measured with libtpu 0.0.48: ``v6e:2x4`` as one 8-chip host and as two 4-chip hosts differ), so
the host shape here is the one a pod of that accelerator type runs on: Cloud TPU's machine types, as
aotc/accelerators.py holds them with each generation's chips, devices and HBM. v4 is left out: libtpu's
compile-only v4 topology has two devices a chip where a v4 pod's JAX has one (megacore).

``topology_for`` is pure data (the core and the plan import it); only ``compile_only_devices`` and
``target_facts`` import JAX.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from aotc.accelerators import parse_accelerator

# what `aotc doctor` tries: Cloud TPU's single-host slices (a v7x host is Cloud's tpu7x-8: 4 chips, 8 TensorCores).
# libtpu 0.0.48 resolves tpu7x in any order; the one refusal once seen ("Invalid TPU external name: TPU7x") was
# libtpu 0.0.21's, loaded through TPU_LIBRARY_PATH (use_this_stacks_libtpu says why that no longer happens)
SINGLE_HOST_SLICES = ("v5e-1", "v5e-4", "v5e-8", "v6e-1", "v6e-4", "v6e-8", "v5p-8", "v7x-8")
# libtpu's prefix for each generation it compiles for here (the facts of each: aotc/accelerators.py)
LIBTPU_NAMES = {"v5e": "v5e", "v5p": "v5p", "v6e": "v6e", "v7x": "tpu7x"}


@dataclass(frozen=True)
class Topology:
    accelerator: str
    name: str  # libtpu's, e.g. "v6e:2x4"
    chips: int
    chips_per_host: tuple[int, int, int]
    hbm_bytes_per_chip: int

    @property
    def hosts(self) -> int:
        return self.chips // math.prod(self.chips_per_host)

    def to_dict(self) -> dict[str, Any]:
        return {"accelerator": self.accelerator, "topology": self.name, "chips": self.chips,
                "chips_per_host": list(self.chips_per_host), "hosts": self.hosts,
                "hbm_bytes_per_chip": self.hbm_bytes_per_chip}


def topology_for(accelerator: str) -> Topology:
    """``v6e-8`` -> libtpu's ``v6e:2x4`` on one host. ValueError names what is not a topology."""
    parsed = parse_accelerator(accelerator)
    generation = parsed.generation
    if generation.name not in LIBTPU_NAMES:
        raise ValueError(f"accelerator {accelerator!r}: no TPU topology aotc can compile for (one of "
                         f"{', '.join(g + '-N' for g in LIBTPU_NAMES)})")
    if parsed.chips & (parsed.chips - 1):
        raise ValueError(f"accelerator {accelerator!r}: {parsed.chips} chips, not a power of two aotc compiles for")
    shape = torus_shape(parsed.chips, generation.dims)
    per_host = (*torus_shape(parsed.host_chips, 2), 1)
    name = f"{LIBTPU_NAMES[generation.name]}:{'x'.join(map(str, shape))}"
    return Topology(accelerator, name, parsed.chips, per_host, generation.hbm_bytes_per_chip)


def torus_shape(chips: int, dims: int) -> tuple[int, ...]:
    """The squarest power-of-two shape, small sides first; a 3D slice under 8 chips is one plane:
    8 -> 2x4 (2D) or 2x2x2 (3D); 4 -> 2x2 or 2x2x1; 32 -> 4x8 or 2x4x4."""
    if dims == 3 and chips < 8:
        return (*torus_shape(chips, 2), 1)
    sides = [1] * dims
    for axis in range(int(math.log2(chips))):
        sides[axis % dims] *= 2
    return tuple(sorted(sides))


def compile_only_devices(topology: Topology) -> list[Any]:
    """The topology's devices: they lower and compile for that TPU, and never run."""
    # libtpu takes a host-wide lock file when it loads, to keep two processes off the same chips; without chips it
    # guards nothing and would serialize parallel builds (and a build beside `aotc doctor`): measured, the second
    # process fails with "Internal error when accessing libtpu multi-process lockfile"
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    use_this_stacks_libtpu()
    from jax.experimental import topologies

    described = topologies.get_topology_desc(platform="tpu", topology_name=topology.name,
                                             chips_per_host_bounds=topology.chips_per_host)
    return list(described.devices)


def use_this_stacks_libtpu() -> None:
    """Compile with the libtpu the fingerprint names: this interpreter's libtpu package, whatever
    TPU_LIBRARY_PATH says. Importing another stack's libtpu package sets that variable (libtpu 0.0.21's, in the
    torch_xla venv, does at import), and every process started from such a process then loads that libtpu:
    measured, a compile-only build from a test process that had imported it compiled with libtpu 0.0.21, which
    refused the stack's kernels ("no such field: 'disable_semaphore_checks'") and knows no v7x ("Invalid TPU
    external name: TPU7x")."""
    import libtpu

    os.environ["TPU_LIBRARY_PATH"] = libtpu.get_library_path()


def target_facts(topology: Topology, devices: list[Any]) -> dict[str, Any]:
    """What JAX's cache key takes from the target (platform, platform_version, topology fingerprint) and what
    the manifest records about it."""
    from jax._src.lib import _jax

    client = devices[0].client
    return {**topology.to_dict(), "platform": client.platform, "platform_version": client.platform_version,
            "device_kind": devices[0].device_kind, "devices": len(devices),
            "topology_fingerprint": str(_jax.get_topology_for_devices(devices).fingerprint()),
            "compile_only": True}


def describe(accelerator: str) -> dict[str, Any]:
    """One target as libtpu resolves it here, or why it cannot."""
    try:
        topology = topology_for(accelerator)
        facts = target_facts(topology, compile_only_devices(topology))
    except Exception as exc:  # libtpu's own refusal, said as it said it
        return {"accelerator": accelerator, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
    return {key: facts[key] for key in ("accelerator", "topology", "device_kind", "devices", "platform_version")}


def targets_on_this_host(python: str, timeout: float = 300) -> list[dict[str, Any]]:
    """``describe`` for each single-host slice, in the runner's interpreter (where JAX and libtpu are)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TPU_SKIP_MDS_QUERY": "1"}
    try:
        proc = subprocess.run([python, "-m", __name__], capture_output=True, text=True, timeout=timeout, env=env)
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return [{"accelerator": "*", "error": f"{python} could not list TPU targets (is libtpu installed there?)"}]


if __name__ == "__main__":
    print(json.dumps([describe(accelerator) for accelerator in SINGLE_HOST_SLICES]))
    sys.exit(0)
