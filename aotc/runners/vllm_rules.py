"""vLLM's own start-up checks on an entry, as plain data: the rules both runners inherit from the vLLM front
end (0.13 for vllm-tpu, 0.32 for tpu-inference; the checks below read the same in both). Each runner's
``validate`` (RunnerSpec.validate) composes these with its platform's own rules.

Each rule returns problems as ``"<key>: <reason> (<vLLM rule>)"``, the key relative to the model's block in
the matrix, so the matrix names file, key and the rule that rejects it. No vLLM import: ``aotc plan`` runs on
the core's Python; tests/vllm_tpu/test_matrix_rules.py holds each rule against vLLM's own code over a sweep.
"""

from __future__ import annotations

# ModelConfig._get_and_verify_max_len: the config keys that bound the model's length (smallest wins)
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")


def scheduler(entry) -> list[str]:
    """SchedulerConfig.verify_max_model_len: with chunked prefill off (V1 turns it on unless the entry says
    enable_chunked_prefill: false) a step must hold a whole prompt; any step must hold a token per sequence."""
    if entry.engine.get("enable_chunked_prefill") is False and entry.max_num_batched_tokens < entry.max_model_len:
        return [f"matrix.max_num_batched_tokens: {entry.max_num_batched_tokens} is below max_model_len "
                f"{entry.max_model_len} with enable_chunked_prefill: false (vLLM SchedulerConfig: a step must hold "
                "a whole prompt)"]
    if entry.max_num_batched_tokens < entry.max_num_seqs:
        return [f"matrix.max_num_batched_tokens: {entry.max_num_batched_tokens} is below max_num_seqs "
                f"{entry.max_num_seqs} (vLLM SchedulerConfig: max_num_batched_tokens must be >= max_num_seqs)"]
    return []


def parallel(entry, hf_config: dict | None) -> list[str]:
    """ModelConfig.verify_with_parallel_config: attention heads split evenly over the tensor-parallel ranks."""
    config = hf_config or {}
    heads = (config.get("text_config") or config).get("num_attention_heads")  # hf_text_config
    tp = entry.tensor_parallel_size
    if isinstance(heads, int) and heads % tp:
        return [f"matrix.tensor_parallel_size: {tp} does not divide the model's {heads} attention heads "
                "(vLLM ModelConfig.verify_with_parallel_config)"]
    return []


def derived_max_model_len(hf_config: dict) -> int | None:
    """The model's own length limit as vLLM derives it, or None where RoPE scaling makes vLLM's answer depend
    on transformers' config patching (vLLM then decides at start-up; aotc does not guess)."""
    if hf_config.get("rope_scaling") or hf_config.get("rope_parameters"):
        return None
    limits = [hf_config[k] for k in MAX_LEN_KEYS if isinstance(hf_config.get(k), int)]
    if isinstance(hf_config.get("model_max_length"), int) and hf_config["model_max_length"]:
        return hf_config["model_max_length"]  # Command-R / Cohere: this key overrides the others
    return min(limits) if limits else None


def max_model_len(entry, hf_config: dict | None) -> list[str]:
    """ModelConfig._get_and_verify_max_len (unless VLLM_ALLOW_LONG_MAX_MODEL_LEN, which aotc does not set)."""
    limit = derived_max_model_len(hf_config) if hf_config else None
    if limit is not None and entry.max_model_len > limit:
        return [f"matrix.max_model_len: {entry.max_model_len} exceeds the model's maximum length {limit} "
                "(vLLM ModelConfig._get_and_verify_max_len)"]
    return []


def quantization(entry, supported: tuple[str, ...], platform: str) -> list[str]:
    """ModelConfig._verify_quantization -> Platform.verify_quantization: the platform's supported list."""
    method = entry.engine.get("quantization")
    if method is not None and method not in supported:
        return [f"engine.quantization: {method!r} is not supported on TPU; supported: {', '.join(supported)} "
                f"({platform}.supported_quantization)"]
    return []


def common(entry, hf_config: dict | None) -> list[str]:
    return scheduler(entry) + parallel(entry, hf_config) + max_model_len(entry, hf_config)

