"""Qwen3-VL and its kin (vLLM's PyTorch models on the torchax path, with cudagraph_mm_encoder).

The stack's MMEncoderJITManager runs the tower once per token budget, then slices each image's rows off the
budget's output on the device (a compile per image token count and place in the batch); its wrapper runs
embed_input_ids unjitted (text embedding, deepstack split, merge and deepstack packing as eager ops). The fix
keeps each budget output whole with the image's place in it (WholeEncoderOutput.start), and jits
embed_input_ids as for LLaVA (llava.py): Qwen3-VL's module keeps the stack's merge (a gather of the rows in
order), and each trace starts with no deepstack rows kept on the model and leaves none behind.
"""

from __future__ import annotations

import contextlib

from .common import WholeEncoderOutput, wrap_once

# the architectures whose merge alone the fixes jit (aotc/runners/tpu_inference/plan/qwen3_vl.py's ARCHITECTURES: their
# tower runs through the stack's MMEncoderJITManager)
JITTED_TORCHAX_MERGES_ONLY = frozenset({"Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration",
                                       "Cosmos3ForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
                                       "Qwen3_5MoeForConditionalGeneration"})


def fix(module) -> None:
    wrap_once(module._TorchaxEncoderModelAdapter, postprocess_encoder_output=lambda _: _whole_budget_outputs)


@contextlib.contextmanager
def no_deepstack_rows_kept(vllm_model):
    """The stack's Qwen3-VL patches keep a step's deepstack rows on the model (`_deepstack_tensors`, set on its
    first image step) and pack whatever is there into the next embedding: a trace starts from none, and leaves
    none behind (a tracer kept there would outlive its trace)."""
    if not getattr(vllm_model, "use_deepstack", False):
        yield
        return
    vllm_model._deepstack_tensors = {}
    try:
        yield
    finally:
        vllm_model._deepstack_tensors = {}


def _whole_budget_outputs(adapter, output, indices, per_item_out_tokens, dest, clone=False, batch_mm_kwargs=None):
    """The stack's postprocess of a token budget's encoder output slices each image's rows on the device, a
    compile per image size and place in the batch; each image keeps the budget's output whole with its rows'
    place in it, and place_encoder_rows takes them from there (keyed by the budget)."""
    if isinstance(output, dict):
        output = output["default"]
    offset = 0
    for index in indices:
        count = per_item_out_tokens[index]
        dest[index] = WholeEncoderOutput(output, count, offset)
        offset += count
