"""A matrix's ``accelerator`` (``<generation>-<count>``, Cloud TPU's accelerator types) and what it holds.

Cloud's number counts chips for v5e and v6e and TensorCores for the others (two a chip): a v5p-8 and a v7x-8
are 4 chips. What JAX and torch_xla see differs again: a v4 or v5p chip is one device (megacore, its two
TensorCores as one), a v2, v3 or v7x chip two (one a TensorCore). The per-chip facts are tpu_info's
(``TpuChip``: HBM, devices a chip); hosts are Cloud TPU's machine types: v5e and v6e up to 8 chips on one
host, the others 4, and every multi-host slice 4-chip hosts.

Cloud names two generations otherwise than the matrix does, and GKE sets Cloud's name in a pod's
``TPU_ACCELERATOR_TYPE``: v5e is ``v5litepod-N``, v7x ``tpu7x-N`` (the count the same).

Pure data: the matrix, the guard and the runners' TPU targets read it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GIB = 1 << 30
MULTI_HOST_CHIPS = 4  # each host of a multi-host slice (Cloud's *-4t machine types, and v4 / v5p / v7x hosts)
CUBE_CHIPS = 64  # a 3D slice beyond one 4x4x4 cube is whole cubes (v4's and v5p's 4x4x12, ...)


@dataclass(frozen=True)
class Generation:
    name: str  # the matrix's: "v5e"
    cloud_name: str  # Cloud's accelerator-type prefix, GKE's TPU_ACCELERATOR_TYPE: "v5litepod"
    cores_per_chip_in_name: int  # what the count counts: 1 (chips) or 2 (TensorCores)
    devices_per_chip: int  # JAX / PJRT devices a chip
    dims: int  # a 2D or 3D torus
    max_chips_per_host: int  # the largest slice one host holds
    hbm_bytes_per_chip: int  # Cloud TPU's published HBM per chip


GENERATIONS = {g.name: g for g in (
    Generation("v2", "v2", 2, 2, 2, 4, 8 * GIB),
    Generation("v3", "v3", 2, 2, 2, 4, 16 * GIB),
    Generation("v4", "v4", 2, 1, 3, 4, 32 * GIB),
    Generation("v5e", "v5litepod", 1, 1, 2, 8, 16 * GIB),
    Generation("v5p", "v5p", 2, 1, 3, 4, 95 * GIB),
    Generation("v6e", "v6e", 1, 1, 2, 8, 32 * GIB),
    Generation("v7x", "tpu7x", 2, 2, 3, 4, 192 * GIB),
)}
FORM = re.compile(r"^([a-z0-9]+)-(\d+)$")


@dataclass(frozen=True)
class Accelerator:
    name: str  # as the matrix writes it: "v7x-8"
    generation: Generation
    chips: int

    @property
    def host_chips(self) -> int:
        """The chips of one of the slice's hosts (all of them for a single-host slice)."""
        return self.chips if self.chips <= self.generation.max_chips_per_host else MULTI_HOST_CHIPS

    @property
    def host_devices(self) -> int:
        """The JAX devices one host's process sees: what a tensor-parallel group spans at most."""
        return self.host_chips * self.generation.devices_per_chip


def parse_accelerator(accelerator: str) -> Accelerator:
    """``v7x-8`` -> 4 chips of v7x. ValueError, one line, names the accepted forms."""
    match = FORM.match(accelerator)
    by_cloud_name = {g.cloud_name: g for g in GENERATIONS.values() if g.cloud_name != g.name}
    if match and match[1] in by_cloud_name:
        raise ValueError(f"{accelerator!r} is Cloud's name (GKE's TPU_ACCELERATOR_TYPE); a matrix writes "
                         f"{by_cloud_name[match[1]].name}-{match[2]}")
    if not match or match[1] not in GENERATIONS:
        raise ValueError(f"{accelerator!r} is no Cloud TPU type: expected <generation>-<count>, the generation one "
                         f"of {', '.join(GENERATIONS)} (e.g. v6e-8, v7x-8)")
    generation, count = GENERATIONS[match[1]], int(match[2])
    chips, remainder = divmod(count, generation.cores_per_chip_in_name)
    if remainder or not is_slice_size(chips, generation):
        counts = ("chips" if generation.cores_per_chip_in_name == 1
                  else f"TensorCores, {generation.cores_per_chip_in_name} a chip")
        cubes = " or whole 4x4x4 cubes" if generation.dims == 3 else ""
        raise ValueError(f"{accelerator!r}: {count} is not a {generation.name} slice size ({generation.name}-N "
                         f"counts {counts}; the chips a power of two{cubes})")
    return Accelerator(accelerator, generation, chips)


def is_slice_size(chips: int, generation: Generation) -> bool:
    power_of_two = chips >= 1 and not chips & (chips - 1)
    return power_of_two or (generation.dims == 3 and chips % CUBE_CHIPS == 0)


def from_cloud_name(accelerator_type: str) -> str:
    """A pod's accelerator as GKE names it (``tpu7x-8``, ``v5litepod-4``) in the matrix's terms (``v7x-8``,
    ``v5e-4``); any other name as it is."""
    match = FORM.match(accelerator_type)
    for generation in GENERATIONS.values():
        if match and match[1] == generation.cloud_name:
            return f"{generation.name}-{match[2]}"
    return accelerator_type


def to_cloud_name(accelerator: str) -> str:
    """The matrix's accelerator (``v5e-4``) as GKE names it in ``TPU_ACCELERATOR_TYPE`` (``v5litepod-4``): what the
    stack reads its cores per chip from on a pod."""
    match = FORM.match(accelerator)
    if match and match[1] in GENERATIONS:
        return f"{GENERATIONS[match[1]].cloud_name}-{match[2]}"
    return accelerator
