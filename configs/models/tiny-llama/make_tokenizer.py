"""Writes tokenizer.json / tokenizer_config.json for the demo model (run once; the output is committed).

A byte-level BPE whose vocabulary is exactly the model's (config.json: vocab_size 512): <pad>, <s>, </s>
(ids 0, 1, 2 as config.json says), the 256 byte tokens, then merges learnt from this repository's README.
Every id the model can emit decodes, every text encodes, and nothing comes from a model hub.

    python configs/models/tiny-llama/make_tokenizer.py
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = Path(__file__).resolve().parent
SPECIALS = ["<pad>", "<s>", "</s>"]
# Enough for `vllm serve`'s chat endpoint; the demo model has dummy weights, so the words do not matter.
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def main() -> None:
    vocab_size = json.loads((HERE / "config.json").read_text())["vocab_size"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([str(HERE.parents[2] / "README.md")], trainer)
    assert tok.get_vocab_size() == vocab_size, tok.get_vocab_size()
    (HERE / "tokenizer.json").write_text(tok.to_str() + "\n")  # compact: ~10 KB
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
              "pad_token": "<pad>", "model_max_length": 256, "clean_up_tokenization_spaces": False,
              "chat_template": CHAT_TEMPLATE}
    (HERE / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


if __name__ == "__main__":
    main()
