"""LoRA entries: the test adapter, the sweep's adapter mix, the stock server's --lora-modules, the
tpu-inference model implementation LoRA needs (a fingerprint input), and vllm-tpu's refusal held against
vLLM 0.13's own code. The builds, verifies and canaries: tests/tpu_inference/test_lora_jax.py."""

from __future__ import annotations

import inspect
import json
from dataclasses import replace

import pytest

from aotc.fingerprint import fingerprint_inputs
from aotc.matrix import parse_matrix
from aotc.runners import traffic
from aotc.runners.lora import projection_shapes, write_adapter
from aotc.runners.tpu_inference.plan.buckets import paddings
from aotc.runners.vllm_tpu.plan import rules
from aotc.server import serve_command

from .conftest import CONFIGS, run_aotc

TINY_LLAMA = CONFIGS / "models" / "tiny-llama"
LORA = {"enable_lora": True, "max_loras": 2, "max_lora_rank": 8}


def entry(runner="tpu-inference", engine=None, **axes):
    axes = {"max_model_len": 128, "max_num_seqs": 8, "max_num_batched_tokens": 64, **axes}
    matrix = ", ".join(f"{k}: [{v}]" for k, v in axes.items())
    e = parse_matrix(f"models: [{{name: m, model: {TINY_LLAMA}, runner: {runner}, device: cpu, "
                     f"matrix: {{{matrix}}}}}]").entries[0]
    # a pinned KV block count: these tests are about LoRA, not the stack's KV sizing
    return replace(e, engine={"num_gpu_blocks_override": 65, **e.engine, **(engine or {})})


def sweep(e, seed=0, requests=40):
    p = paddings(e)
    limits = traffic.Limits.of(e, p["reqs"], p["tokens"], token_buckets=p["tokens"])
    return traffic.plan_traffic(seed, requests, limits, 500)


def test_adapter_has_a_lora_pair_per_layer_and_projection_shaped_by_the_model(tmp_path):
    from safetensors.numpy import load_file

    config = json.loads((TINY_LLAMA / "config.json").read_text())
    out = write_adapter(tmp_path / "a", config, rank=4)
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["peft_type"] == "LORA" and adapter["r"] == 4
    tensors = load_file(str(out / "adapter_model.safetensors"))
    shapes = projection_shapes(config)
    assert len(tensors) == 2 * config["num_hidden_layers"] * len(adapter["target_modules"])
    for name, tensor in tensors.items():
        n_in, n_out = shapes[name.split(".")[-3]]
        assert tensor.shape == ((4, n_in) if ".lora_A." in name else (n_out, 4)), name


def test_committed_demo_adapter_is_what_the_script_writes(tmp_path):
    committed = CONFIGS / "models" / "tiny-llama-lora"
    fresh = write_adapter(tmp_path, json.loads((TINY_LLAMA / "config.json").read_text()), rank=8, seed=0)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert (committed / name).read_bytes() == (fresh / name).read_bytes(), name


@pytest.mark.needs_jax
def test_lora_sweep_mixes_base_and_every_adapter_in_its_batches():
    batches = sweep(entry(engine=LORA))
    assert {r.adapter for b in batches for r in b} == {0, 1, 2}
    for batch in batches:
        if len(batch) >= 2:
            assert 0 in {r.adapter for r in batch} and {r.adapter for r in batch} - {0}, batch
    assert {r.adapter for b in batches if len(b) == 1 for r in b} == {0, 1, 2}  # single requests take turns


@pytest.mark.needs_jax
def test_sweep_without_lora_is_unchanged_and_names_no_adapter():
    plain, lora = sweep(entry()), sweep(entry(engine=LORA))
    assert all(r.adapter == 0 for b in plain for r in b)
    assert [[(r.prompt, r.sampling) for r in b] for b in plain] == [[(r.prompt, r.sampling) for r in b] for b in lora]


def test_lora_slots_follow_vllms_max_loras_default():
    assert traffic.lora_slots({"enable_lora": True}) == 1  # LoRAConfig.max_loras default
    assert traffic.lora_slots({"enable-lora": True, "max-loras": 3}) == 3
    assert traffic.lora_slots({"max_loras": 3}) == 0


@pytest.mark.needs_jax
def test_tpu_inference_lora_runs_on_vllm_model_code_whatever_the_process_says():
    lora, plain = entry(engine=LORA), entry()
    assert fingerprint_inputs(lora, {})["env"]["MODEL_IMPL_TYPE"] == "vllm"
    assert fingerprint_inputs(lora, {"MODEL_IMPL_TYPE": "flax_nnx"})["env"]["MODEL_IMPL_TYPE"] == "vllm"
    assert "MODEL_IMPL_TYPE" not in fingerprint_inputs(plain, {})["env"]
    # the pod's environment (what fetch computes the fingerprint under) says the same as the build's
    cmd = serve_command(lora, "/cache", 8000, environ={})
    assert cmd.env["MODEL_IMPL_TYPE"] == "vllm"
    assert fingerprint_inputs(lora, cmd.process_env({})) == fingerprint_inputs(lora, {})


def option_words(argv: list[str], flag: str) -> list[str]:
    start = argv.index(flag) + 1
    end = next((i for i in range(start, len(argv)) if argv[i].startswith("--")), len(argv))
    return argv[start:end]


LORA_MODULES_MATRIX = """
models:
  - {{name: m, model: {model}, device: cpu, engine: {{lora_modules: {named}}},
     matrix: {{max_model_len: [128], max_num_seqs: [8], max_num_batched_tokens: [64]}}}}
"""


@pytest.mark.parametrize("named, adapters", [
    ("{a: /x, b: /y}", [("a", "/x"), ("b", "/y")]),
    ('["a=/x", "b=/y"]', [("a", "/x"), ("b", "/y")]),
    ("[{name: a, path: /x}, {name: b, path: /y, base_model_name: m}]", [("a", "/x"), ("b", "/y")]),
    ("{name: a, path: /x}", [("a", "/x")]),
    ("a=/x", [("a", "/x")]),
])
def test_every_lora_modules_form_vllm_documents_plans_and_serves_as_vllm_reads_it(named, adapters, tmp_path):
    """The check (vllm-tpu's vLLM 0.13 parser; no enable_lora, which vllm-tpu refuses) and the stock server get
    the same words, one per adapter; the canary's own adapter is served besides the matrix's."""
    from aotc.runners.serve_args import serve_parser

    config = tmp_path / "m.yaml"
    config.write_text(LORA_MODULES_MATRIX.format(model=TINY_LLAMA, named=named))
    result = run_aotc("plan", config)
    assert result.returncode == 0, result.stderr
    e = parse_matrix(config.read_text(), check_stack=False).entries[0]
    cmd = serve_command(e, "/cache", 8000, environ={}, lora_modules={"c": "/z"})
    words = option_words(cmd.argv, "--lora-modules")
    served = serve_parser().parse_known_args(["model", "--lora-modules", *words])[0].lora_modules
    assert [(m.name, m.path) for m in served] == [*adapters, ("c", "/z")]
    # pod-only: which adapters a server names changes no fingerprint
    assert fingerprint_inputs(e, {}) == fingerprint_inputs(replace(e, engine={}), {})


def test_vllm_tpu_lora_refusal_is_vllm_0_13s_own_breakage():
    """The rule stands while vLLM 0.13's TPU runner wraps set_lora with an argument LoRA layers no longer
    take; when a stack fixes it, this fails and the rule goes."""
    from vllm.lora.layers import BaseLayerWithLoRA
    from vllm.v1.worker import tpu_model_runner

    wrapper = inspect.getsource(tpu_model_runner.replace_set_lora)
    assert "embeddings_tensor" in wrapper
    assert "embeddings_tensor" not in inspect.signature(BaseLayerWithLoRA.set_lora).parameters
    assert rules.validate(entry("vllm-tpu", engine=LORA), None) and not rules.validate(entry("vllm-tpu"), None)


def test_vllm_tpu_lora_entry_is_bad_input_in_one_line(tmp_path):
    config = tmp_path / "m.yaml"
    config.write_text(f"defaults: {{runner: vllm-tpu, device: cpu, engine: {json.dumps(LORA)}}}\n"
                      f"models: [{{name: m, model: {TINY_LLAMA}, matrix: {{max_model_len: [128], "
                      "max_num_seqs: [8], max_num_batched_tokens: [64]}}]\n")
    proc = run_aotc("plan", config)
    assert proc.returncode == 2, proc.stderr
    assert "engine.enable_lora: vLLM 0.13's TPU runner cannot start with LoRA" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
