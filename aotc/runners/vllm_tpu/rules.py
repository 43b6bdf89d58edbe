"""vLLM 0.13's own checks on an entry (RunnerSpec.validate): the front end's rules plus TpuPlatform's.
Held against vLLM's code by tests/test_matrix_rules.py."""

from __future__ import annotations

from aotc.runners import vllm_rules

BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)  # vllm.config.cache.BlockSize: `vllm serve --block-size` choices
QUANTIZATIONS = ("fp8", "tpu_int8", "compressed-tensors")  # vllm.platforms.tpu.TpuPlatform.supported_quantization


def validate(entry, hf_config: dict | None) -> list[str]:
    problems = vllm_rules.common(entry, hf_config)
    block = entry.engine.get("block_size")
    if block is not None and block not in BLOCK_SIZES:
        problems.append(f"engine.block_size: {block} is not one of {list(BLOCK_SIZES)} (vllm serve --block-size choices, CacheConfig.BlockSize)")
    return (problems + vllm_rules.quantization(entry, QUANTIZATIONS, "TpuPlatform") + lora(entry)
            + speculative(entry) + data_parallel(entry))


def lora(entry) -> list[str]:
    """vLLM 0.13's TPU runner cannot serve LoRA: tpu_model_runner.replace_set_lora wraps every LoRA layer's
    set_lora with a signature that still takes ``embeddings_tensor``, which LoRAModelManager no longer
    passes, so the first adapter activated (the warm-up's dummy one) fails with a TypeError; past that, its
    bgmv kernels (vllm/lora/ops/xla_ops) call JAX through torch_xla's torchax, which cannot import without
    flax, not part of vLLM's TPU install. A stock server with --enable-lora dies at start-up, so there is nothing to build for it."""
    if entry.engine.get("enable_lora"):
        return ["engine.enable_lora: vLLM 0.13's TPU runner cannot start with LoRA (its replace_set_lora passes "
                "embeddings_tensor, which set_lora no longer takes; its bgmv kernels need torchax, which needs flax); use runner: "
                "tpu-inference (vllm.v1.worker.tpu_model_runner.replace_set_lora)"]
    return []


def speculative(entry) -> list[str]:
    """TpuPlatform.check_and_update_config asserts that no speculative_config is set: a stock server with
    --speculative-config stops before it loads the model."""
    if entry.engine.get("speculative_config"):
        return ["engine.speculative_config: vLLM 0.13's TPU platform does not support speculative decoding "
                "(\"TPU does not support speculative decoding\", TpuPlatform.check_and_update_config); use runner: "
                "tpu-inference"]
    return []


def data_parallel(entry) -> list[str]:
    """vLLM 0.13's data-parallel engine core runs a dummy batch on a rank with no requests while another rank
    has some (DPEngineCoreProc.run_busy_loop -> execute_dummy_batch); TPUWorker has no execute_dummy_batch, so
    the first uneven step kills the server."""
    size = entry.engine.get("data_parallel_size") or 1
    if size > 1:
        return [f"engine.data_parallel_size: {size}: vLLM 0.13's TPU worker cannot serve data parallel (TPUWorker "
                "has no execute_dummy_batch, which DPEngineCoreProc calls on an idle rank); use runner: tpu-inference"]
    return []
