"""A TPU topology's compile-only devices as this process's JAX devices: the stack starts and warms up as on
that TPU, and every graph it would run compiles for the TPU instead (libtpu, on a host with no TPU).

Nothing of the stack is replaced. What changes is the answer to these questions:

* which devices are there: ``jax.devices()`` lists the topology's devices (the stack reads their
  ``device_kind`` to pick its kernels' block sizes, and builds its mesh over their ``coords`` as on a pod);
  host-side work with no placement (a seed, a numpy conversion) stays on the CPU, JAX's default device here;
* what running a jitted function on those devices gives: it is lowered and compiled exactly as a call would
  compile it (through JAX's persistent cache, keyed as on that TPU), and returns abstract arrays, values
  with a shape, a dtype and the compiled output sharding but no data. A later call that takes them compiles
  the same way; so the model's weights, the KV cache and the warm-up's dummy inputs exist only as shapes,
  and a real-size model builds in a CPU host's memory;
* how much HBM is used: the bytes of the abstract arrays held on each device (the weights, once loaded),
  against the stack's own per-device HBM limit, so the stack's KV sizing runs as on the pod;
* what the stack's host-side weight work gives: under its CPU mesh (``cpu_mesh_context``, where it makes
  dummy weights and reshapes checkpoint tensors before placing them), a jitted call whose outputs are
  weight-sized (or whose inputs are abstract) returns abstract arrays on the CPU without compiling, so a
  real-size model's weights are never made on the host either (measured: Qwen3-8B's eager dummy weights took
  the build past 21 GB of RSS);
* what vLLM's PyTorch model (the stack's torchax path: MODEL_IMPL_TYPE=vllm, or an architecture outside its JAX
  registry) is made of: it is made on the ``meta`` device, each tensor the stack converts to JAX becomes an
  abstract array on the host, and the stack places it on the devices with the shardings it computes, where torchax
  wraps it as it wraps any JAX array (abstract arrays are ``jax.Array`` instances). So the torch model never holds
  a weight on the host, and the jitted model call is traced over abstract inputs like any other.

The persistent cache stays off for the CPU client: the artifact holds the TPU executables only.
A graph that needs a value (a sampled token) cannot run: a compile-only build stops at the stack's
warm-up and aotc's beyond-warm-up compiles; serving traffic needs a TPU.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable
from typing import Any

from aotc.runners.twin_flag import on_the_twin

from .serving_fixes.common import attribute_set
from .twin import installed as twin_installed

_installed: dict[str, Any] = {}
# under the stack's CPU mesh, outputs of at least this size stay abstract (a weight); smaller ones are computed
HOST_VALUE_BYTES = 1 << 20
# what each compile for the target reports (the probe's current window takes it); set by the session
on_target_compile: list[Callable[[Any], None]] = []


def installed() -> bool:
    return bool(_installed)


def devices() -> list[Any]:
    return list(_installed["devices"])


def install(devices: list[Any]) -> None:
    """Make ``devices`` (compile-only, from topology.compile_only_devices) this process's TPU devices."""
    if _installed:
        return
    if on_the_twin() or twin_installed():
        raise RuntimeError("the CPU twin is installed in this process: a TPU graph must never hold its stand-ins")
    import jax
    from jax._src import compilation_cache, core, dispatch, pjit
    from jax._src.interpreters import pxla

    cpu_devices = jax.devices("cpu")
    # by identity: a ShapeDtypeStruct hashes and compares by shape, dtype and sharding, so a set of them would count
    # 36 layers' equal weights once (measured: a real 8B model's KV sizing then left the weights out)
    _installed.update(devices=tuple(devices), device_set=frozenset(devices), held=weakref.WeakValueDictionary(),
                      lock=threading.Lock(), run_pjit=pjit._run_python_pjit,
                      device_put=dispatch._batched_device_put_impl, all_devices=jax.devices,
                      host_sharding=jax.sharding.SingleDeviceSharding(cpu_devices[0]))
    jax.config.update("jax_default_device", cpu_devices[0])
    _list_target_devices(jax)
    array = _installed["array"] = _abstract_array_class()
    core.pytype_aval_mappings[array] = core.pytype_aval_mappings[jax.ShapeDtypeStruct]
    pjit._run_python_pjit = _run_jit
    dispatch._batched_device_put_impl = _device_put
    dispatch.device_put_p.def_impl(_device_put)
    cache_used = compilation_cache.is_cache_used
    compilation_cache.is_cache_used = lambda backend: backend.platform != "cpu" and cache_used(backend)
    compile_computation = pxla.MeshComputation.compile

    def compile_and_report(self, *args, **kwargs):
        executable = compile_computation(self, *args, **kwargs)
        if self._platforms and self._platforms[0] == "tpu":
            for report in on_target_compile:
                report(executable)
        return executable

    pxla.MeshComputation.compile = compile_and_report
    _account_hbm_by_held_arrays()
    _load_torch_models_on_meta()


def _list_target_devices(jax) -> None:
    every = _installed["all_devices"]

    def devices(backend=None):
        return list(_installed["devices"]) if backend in (None, "tpu") else every(backend)

    jax.devices = devices
    jax.local_devices = lambda process_index=None, backend=None: devices(backend)
    jax.device_count = lambda backend=None: len(devices(backend))
    jax.local_device_count = lambda backend=None: len(devices(backend))


def _abstract_array_class():
    """``jax.ShapeDtypeStruct`` (JAX abstracts it wherever a jit takes an argument) that also answers what the
    stack asks of a computed array."""
    import jax

    class AbstractArray(jax.ShapeDtypeStruct, jax.Array):
        """A value on a compile-only device: shape, dtype, sharding; never data."""

        __slots__ = ("__weakref__",)

        @property
        def device(self):
            devices = self.sharding.device_set
            return next(iter(devices)) if len(devices) == 1 else self.sharding

        @property
        def is_fully_addressable(self) -> bool:
            return self.sharding.is_fully_addressable

        def block_until_ready(self):
            return self

        def is_deleted(self) -> bool:
            return False

        def delete(self) -> None:
            pass

        def bytes_per_device(self) -> int:
            shard = self.sharding.shard_shape(self.shape) if self.sharding is not None else self.shape
            return math.prod(shard) * self.dtype.itemsize

    return AbstractArray


def abstract(aval, sharding) -> Any:
    value = _installed["array"](aval.shape, aval.dtype, sharding=sharding, weak_type=aval.weak_type)
    if sharding is not None and _on_target(sharding):
        with _installed["lock"]:
            _installed["held"][id(value)] = value
    return value


def _on_target(placement: Any) -> bool:
    """A sharding, or a device, on the target's compile-only devices."""
    if placement in _installed["device_set"]:
        return True
    device_set = getattr(placement, "device_set", None)
    return bool(device_set) and not _installed["device_set"].isdisjoint(device_set)


def _sharding_of(placement: Any) -> Any:
    from jax.sharding import Sharding, SingleDeviceSharding

    return placement if isinstance(placement, Sharding) else SingleDeviceSharding(placement)


def _is_abstract(value: Any) -> bool:
    return isinstance(value, _installed["array"]) or _on_target(getattr(value, "sharding", None))


def _run_jit(p, args_flat, fun, args, kwargs):
    """pjit's ``_run_python_pjit`` (one jitted call with its inference done): run it where it can run, else
    compile it as the call would and answer with abstract outputs."""
    from jax._src import core

    if any(isinstance(arg, core.Tracer) for arg in args_flat):  # a call inside a trace: part of a graph
        return _installed["run_pjit"](p, args_flat, fun, args, kwargs)
    out_avals = p.params["jaxpr"].out_avals
    if _in_host_weight_work() and (any(map(_is_abstract, args_flat)) or _weight_sized(out_avals)):
        return _abstract_result(p, args_flat, [_installed["host_sharding"]] * len(out_avals))
    if not any(map(_is_abstract, args_flat)):
        try:
            return _installed["run_pjit"](p, args_flat, fun, args, kwargs)
        except AttributeError as exc:  # compiled for the target's devices, which cannot run it
            if "local_devices" not in str(exc):
                raise
    from jax._src import pjit
    from jax._src.interpreters import mlir

    params = p.params
    computation = pjit._resolve_and_lower(
        [pjit.convert_to_metaty(a) for a in args_flat], jaxpr=params["jaxpr"],
        in_shardings=params["in_shardings"], out_shardings=params["out_shardings"],
        in_layouts=params["in_layouts"], out_layouts=params["out_layouts"],
        donated_invars=params["donated_invars"], ctx_mesh=params["ctx_mesh"], name=params["name"],
        keep_unused=params["keep_unused"], inline=params["inline"], lowering_platforms=None,
        lowering_parameters=mlir.LoweringParameters(), pgle_profiler=None,
        compiler_options_kvs=params["compiler_options_kvs"])
    return _abstract_result(p, args_flat, computation.compile()._out_shardings)


def _abstract_result(p, args_flat, out_shardings) -> tuple:
    """What ``_run_python_pjit`` returns for a call, its outputs abstract arrays placed by ``out_shardings``."""
    from jax._src import tree_util

    jaxpr = p.params["jaxpr"]
    out_flat = [abstract(aval, sharding) for aval, sharding in zip(jaxpr.out_avals, out_shardings)]
    return tree_util.tree_unflatten(p.out_tree, out_flat), out_flat, p.out_tree, args_flat, jaxpr, None, None, []


def _in_host_weight_work() -> bool:
    """The stack's CPU mesh is this thread's mesh: weights are being made or reshaped on the host, to be placed on
    the devices next. Nothing there needs a value in a build (dummy weights), so nothing there is computed."""
    from jax._src import mesh

    current = mesh.get_concrete_mesh()
    return bool(current is not None and not current.empty
                and all(device.platform == "cpu" for device in current.devices.flat))


def _weight_sized(avals) -> bool:
    """Outputs too large to be a seed or a scalar the stack reads back (a PRNG key is computed, a weight is not)."""
    return sum(math.prod(aval.shape) * getattr(aval.dtype, "itemsize", 0) for aval in avals) >= HOST_VALUE_BYTES


def _device_put(*xs, devices, srcs, copy_semantics, dst_avals=None):
    from jax._src import core
    from jax._src.layout import Format

    # a Format places with its sharding (the stack relays out MoE weights and the RoPE table so): the layout is the
    # compiler's business, the bytes per device are the sharding's
    placements = [d.sharding if isinstance(d, Format) else d for d in devices]
    if not any(_on_target(d) or _is_abstract(x) for x, d in zip(xs, placements)):
        return _installed["device_put"](*xs, devices=devices, srcs=srcs, copy_semantics=copy_semantics,
                                        dst_avals=dst_avals or [None] * len(xs))
    return [abstract(core.shaped_abstractify(x), _sharding_of(d) if _on_target(d) else getattr(x, "sharding", None))
            for x, d in zip(xs, placements)]


def held_bytes(device: Any) -> int:
    """Bytes of the abstract arrays alive on ``device`` (the weights once loaded, then the KV cache)."""
    with _installed["lock"]:
        held = list(_installed["held"].values())
    return sum(a.bytes_per_device() for a in held if device in a.sharding.device_set)


def _account_hbm_by_held_arrays() -> None:
    from tpu_inference import utils

    def hbm_usage_bytes(devices) -> list[tuple[int, int]]:
        limit = utils.get_device_hbm_limit()
        return [(held_bytes(device), limit) for device in devices]

    utils.hbm_usage_bytes = hbm_usage_bytes


def _load_torch_models_on_meta() -> None:
    """vLLM's PyTorch model (the stack serves it through torchax) is made on the ``meta`` device, and each of its
    tensors the stack converts to JAX on the host becomes an abstract array there, which the stack then places
    on the devices with the shardings it computes: the torch model never holds a weight on the host."""
    from tpu_inference.models.common import model_loader

    get_vllm_model = model_loader.get_vllm_model

    def get_vllm_model_on_meta(vllm_config, *args, **kwargs):
        _convert_meta_tensors_to_abstract_arrays()
        with attribute_set(vllm_config.load_config, "device", "meta"):
            return get_vllm_model(vllm_config, *args, **kwargs)

    model_loader.get_vllm_model = get_vllm_model_on_meta


def _convert_meta_tensors_to_abstract_arrays() -> None:
    """Each name the stack's modules call torch-to-JAX conversion by (torchax's ``t2j``, tpu-inference's own, each
    imported by name), once the wrapper of vLLM models has imported them, converts a meta tensor to an abstract
    array on the host; any other tensor as before."""
    import sys

    import tpu_inference.models.vllm.vllm_model_wrapper  # noqa: F401  (imports the stack's weight processing)
    from torchax.ops import mappings
    from tpu_inference import utils

    conversions = _installed.setdefault("t2j", {})
    if not conversions:  # keyed by the originals' ids; each original is kept alive in its value
        conversions.update({id(to_jax): (to_jax, _converting_meta(to_jax)) for to_jax in (mappings.t2j, utils.t2j)})
    for name, module in list(sys.modules.items()):
        if name.partition(".")[0] in ("tpu_inference", "torchax"):
            for attribute in ("t2j", "torchax_t2j"):
                if id(getattr(module, attribute, None)) in conversions:
                    setattr(module, attribute, conversions[id(getattr(module, attribute))][1])


def _converting_meta(to_jax: Callable) -> Callable:
    def t2j(tensor, *args, **kwargs):
        if tensor.device.type != "meta":
            return to_jax(tensor, *args, **kwargs)
        from jax import ShapeDtypeStruct
        from torchax.ops.mappings import t2j_dtype

        return abstract(ShapeDtypeStruct(tuple(tensor.shape), t2j_dtype(tensor.dtype)), _installed["host_sharding"])

    return t2j


def memory_figures(executable: Any) -> dict[str, int]:
    """The compiler's memory analysis of one executable, per device, and its generated code size."""
    analysis = executable.memory_analysis()
    fields = ("generated_code_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes",
              "alias_size_in_bytes", "temp_size_in_bytes", "peak_memory_in_bytes")
    return {name.replace("_size_in_bytes", "_bytes").replace("_in_bytes", "_bytes"): int(getattr(analysis, name))
            for name in fields if hasattr(analysis, name)}
