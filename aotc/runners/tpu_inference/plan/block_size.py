"""The KV block size (tokens per block: vLLM's CacheConfig.block_size) tpu-inference 0.32 gives an entry, as
TpuPlatform.check_and_update_config sets it, and the MLA test it turns on (vLLM's ModelConfig.use_mla).

Re-implemented, not imported (the core has no tpu_inference); tests/tpu_inference/test_plan_jax.py holds it
against the engine config the stack builds and against the backends' own get_page_size / get_min_page_size.
"""

from __future__ import annotations

from aotc.entry import Entry
from aotc.runners.paddings import cdiv, next_power_of_2, page_size

# PallasMLAttentionBackend.get_page_size: one size whatever the entry's lengths
MLA_PAGE_SIZE = 1024
# PallasAttentionBackend.get_min_page_size: the ragged paged attention kernel's block tables of every request
# share this many 4-byte words of SMEM
BLOCK_TABLE_WORDS = 1024 * 1024 // 2 // 4

# vLLM 0.32's ModelArchConfigConvertorBase.is_deepseek_mla: the text config's model types that take the MLA path
# when they set kv_lora_rank (a DeepSeek V4 config with compress_ratios: when it sets head_dim)
MLA_MODEL_TYPES = frozenset({"axk1", "deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_v4", "deepseek_v41",
                             "dots3_note", "deepseek_mtp", "k3_dspark", "glm5_next", "glm5_next_text", "glm_moe_dsa",
                             "glm4_moe_lite", "glm4_moe_lite_mtp", "kimi_k2", "kimi_linear", "longcat_flash",
                             "pangu_ultra_moe", "pangu_ultra_moe_mtp", "bailing_hybrid", "bailing_hybrid_mtp",
                             "bailing_hybrid_v3_mtp", "hy_v4", "hy_v4_mtp"})


def uses_mla(hf_config: dict | None) -> bool:
    """vLLM's ModelConfig.use_mla for a config (VLLM_MLA_DISABLE is not a matrix key)."""
    text = (hf_config or {}).get("text_config") or hf_config or {}
    rank_key = "head_dim" if text.get("model_type") == "deepseek_v4" and "compress_ratios" in text else "kv_lora_rank"
    return (text.get("model_type") in MLA_MODEL_TYPES and text.get(rank_key) is not None
            and text.get("is_causal", True) is not False)


def min_page_size(max_model_len: int, max_num_seqs: int) -> int:
    """PallasAttentionBackend.get_min_page_size: the smallest power-of-two block whose block tables for
    ``max_num_seqs`` full-length requests fit the kernel's SMEM."""
    return next_power_of_2(cdiv(max_model_len, BLOCK_TABLE_WORDS // max_num_seqs))


def kv_block_size(entry: Entry, hf_config: dict | None) -> int:
    """CacheConfig.block_size after TpuPlatform.check_and_update_config: a matrix's block_size is kept as given;
    else an MLA model's backend size; else the Pallas page size, raised to the minimum its SMEM allows."""
    if configured := entry.engine.get("block_size"):
        return int(configured)
    if uses_mla(hf_config):
        return MLA_PAGE_SIZE
    return max(page_size(entry.max_model_len), min_page_size(entry.max_model_len, entry.max_num_seqs))
