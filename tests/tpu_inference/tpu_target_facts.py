"""Runs under the JAX venv (tests/tpu_inference/conftest.py: run_jax): what libtpu and JAX say about aotc's TPU
targets on this host, which has no TPU, and what a TPU-target artifact's cache entries hold.

stdin: {"accelerators": [...], "artifact_cache": DIR | null}
stdout (last line): {"topologies", "multi_host_refusal", "host_split_fingerprints", "platform_version",
                     "cpu_entry_has_host_code", "twin_flag_refusal", "twin_after_target_refusal", "entries"}
"""

import json
import os
import sys
import tempfile
from pathlib import Path

import jax
import numpy as np

from aotc.entry import Entry
from aotc.runners.tpu_inference import engine
from aotc.runners.tpu_inference.topology import compile_only_devices, target_facts, topology_for

ELF_MAGIC = b"\x7fELF"
PALLAS_CALL = b"tpu_custom_call"
request = json.load(sys.stdin)


def decoded(path: Path) -> bytes:
    """A persistent-cache entry as JAX's own cache reads it back (its compression, then the executable)."""
    from jax._src import compilation_cache

    return compilation_cache.decompress_executable(path.read_bytes())


def topology_row(accelerator: str) -> dict:
    topology = topology_for(accelerator)
    devices = compile_only_devices(topology)
    facts = target_facts(topology, devices)
    return {**facts, "processes": sorted({d.process_index for d in devices})}


def host_split_fingerprints() -> list[str]:
    """libtpu's fingerprint of v6e:2x4 as one 8-chip host and as two 4-chip hosts (the cache key hashes it)."""
    from jax._src.lib import _jax
    from jax.experimental import topologies

    prints = []
    for bounds in ((2, 4, 1), (2, 2, 1)):
        devices = topologies.get_topology_desc(platform="tpu", topology_name="v6e:2x4",
                                               chips_per_host_bounds=bounds).devices
        prints.append(str(_jax.get_topology_for_devices(devices).fingerprint()))
    return prints


def cpu_entry_has_host_code() -> bool:
    """The check below can fail: XLA:CPU entries (what the twin writes) hold host object code (most of them; the
    twin's demo: 50 of 61)."""
    with tempfile.TemporaryDirectory() as cache:
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
        x = jax.numpy.ones((256, 256), device=jax.devices("cpu")[0])
        jax.jit(lambda a: jax.numpy.tanh(a @ a).sum(axis=0))(x).block_until_ready()
        return any(ELF_MAGIC in decoded(p) for p in Path(cache).glob("*-cache"))


def keys_of_a_call_and_of_the_stacks_lowering() -> tuple[list[str], list[str]]:
    """The stack's RPA kernel under jit on the v6e-1 topology, twice: called on abstract arrays (what a compile-only
    build does with a call the stack makes) and lowered by hand with jax.jit(...).lower(...).compile() (the stack's
    own AOT path, CompilationManager._run_compilation). The persistent cache's file names are the keys."""
    import jax.numpy as jnp
    import numpy as np
    from jax._src import compilation_cache
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    from tpu_inference.kernels.ragged_paged_attention.v3.kernel import get_kv_cache_shape
    from tpu_inference.layers.common.attention_interface import sharded_ragged_paged_attention
    from tpu_inference.layers.common.sharding import ShardingAxisName as Axis

    axes = ("data", "attn_dp", "attn_dp_expert", "expert", "model")
    mesh = Mesh(np.array(jax.devices()).reshape(1, 1, 1, 1, 1), axes)
    tokens, heads, kv_heads, dim, seqs = 64, 8, 4, 128, 8
    qkv, batch = PartitionSpec(Axis.ATTN_DATA, Axis.ATTN_HEAD, None), PartitionSpec(Axis.ATTN_DATA)
    shapes = [((tokens, heads, dim), jnp.bfloat16, qkv), ((tokens, kv_heads, dim), jnp.bfloat16, qkv),
              ((tokens, kv_heads, dim), jnp.bfloat16, qkv),
              (get_kv_cache_shape(64, 16, kv_heads, dim, jnp.bfloat16), jnp.bfloat16,
               PartitionSpec(Axis.ATTN_DATA, None, Axis.ATTN_HEAD, None, None)),
              ((seqs,), jnp.int32, batch), ((seqs * 8,), jnp.int32, batch), ((seqs + 1,), jnp.int32, batch),
              ((3,), jnp.int32, batch)]

    def attention(*args):
        return sharded_ragged_paged_attention(mesh, *args, None, sm_scale=0.1)

    keys = []
    for way in ("call", "lower"):
        cache = tempfile.mkdtemp()
        compilation_cache.reset_cache()
        jax.clear_caches()
        jax.config.update("jax_compilation_cache_dir", cache)
        with jax.set_mesh(mesh):
            if way == "call":  # device_put to the topology gives abstract arrays; the jitted call compiles
                args = [jax.device_put(np.zeros(shape, dtype), NamedSharding(mesh, spec))
                        for shape, dtype, spec in shapes]
                jax.jit(attention)(*args)
            else:
                args = [jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))
                        for shape, dtype, spec in shapes]
                jax.jit(attention).lower(*args).compile()
        keys.append(sorted(p.name for p in Path(cache).glob("*-cache")))
    return keys[0], keys[1]


def host_weight_made_under_the_stacks_cpu_mesh(device) -> dict:
    """A 1 GiB dummy weight made as tpu-inference's dummy loader makes each one (jax.random.uniform under its
    cpu_mesh_context), then placed on the target device: the host's peak RSS before and after, and what is held."""
    import resource

    from tpu_inference.layers.common.utils import cpu_mesh_context

    shape, before_held = (8192, 65536), compile_only.held_bytes(device)
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with cpu_mesh_context():
        weight = jax.random.uniform(jax.random.PRNGKey(0), shape, jax.numpy.bfloat16, minval=-1e-3, maxval=1e-3)
    placed = jax.device_put(weight, device)
    return {"bytes": int(np.prod(shape)) * 2, "type": type(weight).__name__,
            "host_growth": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - peak_before,
            "held_growth": compile_only.held_bytes(device) - before_held, "placed_type": type(placed).__name__}


def torch_weight_made_on_meta(device) -> dict:
    """A 1 GiB weight of vLLM's PyTorch model as a compile-only build makes it (on the meta device), through the
    stack's own torch-to-JAX placing (cleanup_sharding, the torchax path's) and then a torch Parameter, as the
    stack's weight processing wraps it: what is placed, what the device holds, the host's peak RSS growth."""
    import resource

    import torch
    from jax.experimental.layout import Layout
    from jax.sharding import NamedSharding, PartitionSpec
    from tpu_inference import utils
    from tpu_inference.layers.common.utils import general_device_put
    from tpu_inference.layers.vllm.process_weights import cleanup_sharding

    compile_only._convert_meta_tensors_to_abstract_arrays()
    shape, before_held = (8192, 65536), compile_only.held_bytes(device)
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tensor = torch.empty(shape, dtype=torch.bfloat16, device="meta")
    mesh = jax.sharding.Mesh(np.array([device]), ("model",))
    placed = cleanup_sharding._convert_to_torchax_and_shard(tensor, NamedSharding(mesh, PartitionSpec()))
    parameter = torch.nn.Parameter(placed, requires_grad=False)
    held = compile_only.held_bytes(device) - before_held
    # the stack places MoE weights and the RoPE table with a layout too (general_device_put(..., layout=...))
    laid_out = general_device_put(utils.t2j(tensor), NamedSharding(mesh, PartitionSpec()), layout=Layout((0, 1)))
    return {"bytes": int(np.prod(shape)) * 2, "placed_type": type(placed._elem).__name__,
            "parameter_shape": list(parameter.shape), "held_growth": held,
            "laid_out_held_growth": compile_only.held_bytes(device) - before_held - held,
            "laid_out_type": type(laid_out).__name__,
            "host_growth": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - peak_before}


def refusal(action) -> str | None:
    try:
        action()
    except RuntimeError as exc:
        return str(exc)
    return None


def entries(cache: str | None) -> dict:
    if not cache:
        return {}
    return {p.name: {"host_code": ELF_MAGIC in (data := decoded(p)), "pallas": PALLAS_CALL in data}
            for p in sorted(Path(cache).glob("*-cache"))}


from aotc.runners.tpu_inference import compile_only, twin  # noqa: E402

facts = {
    "topologies": {a: topology_row(a) for a in request["accelerators"]},
    "host_split_fingerprints": host_split_fingerprints(),
    "cpu_entry_has_host_code": cpu_entry_has_host_code(),
    "entries": entries(request.get("artifact_cache")),
}
try:
    engine.compile_only_target(Entry(name="multi-host", model_name="m", model="m", revision="main",
                                     runner="tpu-inference", device="tpu", accelerator="v6e-16", dtype="bfloat16",
                                     max_model_len=128, max_num_seqs=8, max_num_batched_tokens=64,
                                     tensor_parallel_size=16))
except ValueError as exc:
    facts["multi_host_refusal"] = str(exc)
v6e = topology_for("v6e-1")
os.environ["AOTC_CPU_TWIN"] = "1"
facts["twin_flag_refusal"] = refusal(lambda: compile_only.install(compile_only_devices(v6e)))
del os.environ["AOTC_CPU_TWIN"]
compile_only.install(compile_only_devices(v6e))
facts["platform_version"] = jax.devices()[0].client.platform_version
facts["twin_after_target_refusal"] = refusal(twin.install)
facts["call_keys"], facts["lowered_keys"] = keys_of_a_call_and_of_the_stacks_lowering()
device = jax.devices()[0]
weights = [jax.device_put(np.zeros((256, 1024), np.float32), device) for _ in range(3)]  # three equal layers
facts["held_bytes"], facts["one_weight_bytes"] = compile_only.held_bytes(device), 256 * 1024 * 4
facts["host_weight"] = host_weight_made_under_the_stacks_cpu_mesh(device)
facts["torch_weight"] = torch_weight_made_on_meta(device)
print(json.dumps(facts))
