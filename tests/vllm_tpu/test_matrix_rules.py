"""The matrix rejects exactly what vLLM 0.13 rejects: each rule of the vllm-tpu runner held against vLLM's own
code over a randomized sweep (tpu-inference's against vLLM 0.32's in tests/tpu_inference/test_plan_jax.py)."""

from __future__ import annotations

import inspect
import json
import os
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from aotc.errors import MatrixError
from aotc.matrix import parse_matrix
from aotc.runners import vllm_rules
from aotc.runners.vllm_tpu.plan import rules
from tests.conftest import CONFIGS


def entry(runner="vllm-tpu", engine="{}", **axes):
    axes = {"max_model_len": 128, "max_num_seqs": 8, "max_num_batched_tokens": 64, **axes}
    matrix = ", ".join(f"{k}: [{v}]" for k, v in axes.items())
    return parse_matrix(f"models: [{{name: m, model: org/m, runner: {runner}, device: cpu, engine: {engine}, "
                        f"matrix: {{{matrix}}}}}]").entries[0]


def vllm_accepts(fn) -> bool:
    try:
        fn()
    except (ValueError, TypeError):
        return False
    return True


def test_scheduler_rule_is_vllms_over_a_sweep():
    from vllm.config import SchedulerConfig

    rng = random.Random(3)
    for _ in range(300):
        seqs, tokens, length = rng.randint(1, 512), rng.randint(1, 4096), rng.randint(1, 8192)
        chunked = rng.choice((True, False, None))
        theirs = vllm_accepts(lambda: SchedulerConfig(
            max_num_batched_tokens=tokens, max_num_seqs=seqs, max_model_len=length, is_encoder_decoder=False,
            **({} if chunked is None else {"enable_chunked_prefill": chunked})))
        e = SimpleNamespace(max_num_batched_tokens=tokens, max_num_seqs=seqs, max_model_len=length,
                            engine={} if chunked is None else {"enable_chunked_prefill": chunked})
        assert (not vllm_rules.scheduler(e)) == theirs, (seqs, tokens, length, chunked)


def test_block_sizes_are_vllm_serves():
    # CacheConfig skips validation of block_size; `vllm serve --block-size` (EngineArgs' parser) checks it
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    parser.exit = parser.error = lambda *a, **k: (_ for _ in ()).throw(ValueError(a))
    for block in [1, 2, 4, 8, 16, 24, 32, 64, 128, 256, 512, 1024]:
        theirs = vllm_accepts(lambda: parser.parse_args(["--block-size", str(block)]))
        ours = rules.validate(replace(entry(), engine={"block_size": block}), None)
        assert (not ours) == theirs, block


def test_quantizations_are_tpu_platforms():
    from vllm.platforms.tpu import TpuPlatform

    assert rules.QUANTIZATIONS == tuple(TpuPlatform.supported_quantization)


def test_head_rule_is_vllms():
    from vllm.config import ModelConfig

    for heads in [1, 6, 8, 12, 32, 40]:
        for tp in [1, 2, 3, 4, 8]:
            fake = SimpleNamespace(hf_text_config=SimpleNamespace(num_attention_heads=heads))
            parallel = SimpleNamespace(tensor_parallel_size=tp, enable_expert_parallel=False, pipeline_parallel_size=1,
                                       decode_context_parallel_size=1)
            theirs = vllm_accepts(lambda: ModelConfig.verify_with_parallel_config(fake, parallel))
            ours = vllm_rules.parallel(SimpleNamespace(tensor_parallel_size=tp), {"num_attention_heads": heads})
            assert (not ours) == theirs, (heads, tp)


@pytest.mark.parametrize("config", [{"max_position_embeddings": 2048}, {"n_positions": 1024, "seq_length": 4096},
                                    {"model_max_length": 8192, "max_position_embeddings": 2048}, {}])
def test_max_len_rule_is_vllms(config):
    from transformers import PretrainedConfig
    from vllm.config.model import _get_and_verify_max_len

    for length in [128, 1024, 2048, 4096, 8192, 16384]:
        hf = PretrainedConfig(**config)
        theirs = vllm_accepts(lambda: _get_and_verify_max_len(hf, None, length, False, None))
        ours = vllm_rules.max_model_len(SimpleNamespace(max_model_len=length), config)
        assert (not ours) == theirs, (config, length)


@pytest.mark.parametrize("runner", ["vllm-tpu", pytest.param("tpu-inference", marks=pytest.mark.needs_jax)])
@pytest.mark.parametrize("tokens", [8, 96, 100, 384, 1000])
def test_budgets_vllm_accepts_are_accepted(runner, tokens):
    assert entry(runner=runner, max_num_batched_tokens=tokens).max_num_batched_tokens == tokens


SPECULATIVE = '{speculative_config: {method: ngram, num_speculative_tokens: 2, prompt_lookup_max: 3}}'


def test_vllm_tpu_speculative_refusal_is_tpu_platforms_own():
    """TpuPlatform stops any config with a speculative_config; when a stack serves it, this fails and the
    rule goes."""
    from vllm.config import CompilationMode, CUDAGraphMode
    from vllm.platforms.tpu import TpuPlatform

    def platform_check(speculative_config):
        compilation = SimpleNamespace(mode=CompilationMode.DYNAMO_TRACE_ONCE, cudagraph_mode=CUDAGraphMode.NONE,
                                      backend="openxla")
        TpuPlatform.check_and_update_config(SimpleNamespace(
            cache_config=SimpleNamespace(block_size=16), compilation_config=compilation,
            speculative_config=speculative_config, model_config=None))

    with pytest.raises(AssertionError, match="TPU does not support speculative decoding"):
        platform_check(SimpleNamespace(method="ngram"))
    with pytest.raises(MatrixError, match=r"engine\.speculative_config: vLLM 0\.13's TPU platform does not support"):
        entry(engine=SPECULATIVE)
    assert entry(engine="{speculative_config: null}")


def test_vllm_tpu_data_parallel_refusal_is_vllm_0_13s_own_gap():
    """vLLM 0.13's DP engine core asks an idle rank's worker for a dummy batch, which its TPU worker lacks."""
    from vllm.v1.engine.core import DPEngineCoreProc
    from vllm.v1.worker.gpu_worker import Worker
    from vllm.v1.worker.tpu_worker import TPUWorker

    assert "self.execute_dummy_batch()" in inspect.getsource(DPEngineCoreProc.run_busy_loop)
    assert hasattr(Worker, "execute_dummy_batch") and not hasattr(TPUWorker, "execute_dummy_batch")
    with pytest.raises(MatrixError, match=r"engine\.data_parallel_size: 2: vLLM 0\.13's TPU worker cannot serve"):
        entry(engine="{data_parallel_size: 2}")
    assert entry(engine="{data_parallel_size: 1}")


STATEFUL = """
import importlib, json
from vllm.model_executor.models.interfaces import is_attention_free, is_hybrid
from vllm.model_executor.models.registry import _VLLM_MODELS
found = []
for arch, (module, name) in _VLLM_MODELS.items():
    try:
        cls = getattr(importlib.import_module(f"vllm.model_executor.models.{module}"), name)
    except ImportError:  # a model whose package this install lacks: no server starts with it at all
        continue
    if is_hybrid(cls) or is_attention_free(cls):
        found.append(arch)
print(json.dumps(found))
"""


def test_vllm_tpu_refuses_exactly_vllm_0_13s_models_with_mamba_type_layers():
    """vLLM 0.13's registry, class by class (in a process of its own: it imports every model): the hybrid and
    attention-free ones are the rule's list. Its TPU runner gives no cache to a layer that is not attention, and
    TpuPlatform has no current_device (Qwen3-Next's gated delta net calls it)."""
    from vllm.platforms.tpu import TpuPlatform
    from vllm.v1.worker.tpu_model_runner import TPUModelRunner

    proc = subprocess.run([sys.executable, "-c", STATEFUL], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PJRT_DEVICE": "CPU"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert set(json.loads(proc.stdout.strip().splitlines()[-1])) == rules.STATEFUL_ARCHITECTURES
    source = inspect.getsource(TPUModelRunner.get_kv_cache_spec)
    assert "isinstance(attn_module, Attention)" in source and "Mamba" not in source
    assert TpuPlatform().current_device is None


def test_vllm_tpu_plan_refuses_a_hybrid_model_naming_tpu_inference():
    matrix = """
models:
  - name: next
    model: ./models/tiny-qwen3-next
    runner: {runner}
    device: cpu
    matrix: {{max_model_len: [128], max_num_seqs: [8], max_num_batched_tokens: [64]}}
"""
    with pytest.raises(MatrixError, match=r"model: vLLM 0\.13's TPU runner cannot serve Qwen3NextForCausalLM, .*"
                                          r"runner: tpu-inference serves Qwen3-Next"):
        parse_matrix(matrix.format(runner="vllm-tpu"), base_dir=CONFIGS, check_stack=False)
    assert parse_matrix(matrix.format(runner="tpu-inference"), base_dir=CONFIGS, check_stack=False).entries


CONSTRUCTION_FACTS = Path(__file__).parent / "construction_facts.py"


def test_vllm_tpu_refuses_exactly_the_moe_models_vllm_0_13s_tpu_runner_cannot_build_or_route():
    """Every MoE model of vLLM 0.13's registry, built on the twin's platform (a TpuPlatform) from transformers'
    own config class, in a process of its own (8 s): the ones whose constructor fails on the TPU attention backend
    or whose FusedMoE layers forward_tpu refuses are the rule's, with the same reason; an architecture the probe
    cannot build (transformers' class lacks a field vLLM reads) is left to the build, unless it shares vLLM's
    class with one probed."""
    from vllm.model_executor.models.registry import _VLLM_MODELS

    proc = subprocess.run([sys.executable, str(CONSTRUCTION_FACTS)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PJRT_DEVICE": "CPU", "AOTC_CPU_TWIN": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    verdicts = json.loads(proc.stdout.strip().splitlines()[-1])
    probed = {arch: verdict for arch, verdict in verdicts.items() if not verdict.startswith("config: ")}
    refused = {arch: verdict for arch, verdict in probed.items() if verdict != "serves"}
    assert refused == {arch: r for arch, r in rules.UNSERVED_MOE_ARCHITECTURES.items() if arch in probed}
    for arch, reason in rules.UNSERVED_MOE_ARCHITECTURES.items():
        assert arch in probed or any(_VLLM_MODELS[arch] == _VLLM_MODELS[other] and refused.get(other) == reason
                                     for other in probed), arch
        assert reason.split(":")[0] in rules.WHERE_IT_STOPS
    # the zoo's vllm-tpu MoE entries route as forward_tpu takes
    assert {"Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "MixtralForCausalLM"} <= probed.keys() - refused.keys()


@pytest.mark.parametrize("model", ["tiny-gpt-oss", "tiny-llama4"])
def test_vllm_tpu_plan_refuses_an_moe_model_its_runner_cannot_serve_naming_the_reason(model):
    matrix = f"""
models:
  - name: moe
    model: ./models/{model}
    runner: {{runner}}
    device: cpu
    matrix: {{{{max_model_len: [128], max_num_seqs: [8], max_num_batched_tokens: [64]}}}}
"""
    arch = json.loads((CONFIGS / "models" / model / "config.json").read_text())["architectures"][0]
    with pytest.raises(MatrixError, match=rf"model: vLLM 0\.13's TPU runner cannot serve {arch}: "
                                          rf"{rules.UNSERVED_MOE_ARCHITECTURES[arch]} \(.*runner: tpu-inference"):
        parse_matrix(matrix.format(runner="vllm-tpu"), base_dir=CONFIGS, check_stack=False)
    assert parse_matrix(matrix.format(runner="tpu-inference"), base_dir=CONFIGS, check_stack=False).entries
