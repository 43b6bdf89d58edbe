"""The demo model's tokenizer: fits the model's vocabulary and loads offline in both stacks (the stock
`vllm serve` and `vllm bench serve` need one; nothing may come from a model hub)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .conftest import PYTHON_ENV, REPO

MODEL = REPO / "configs" / "models" / "tiny-llama"
PROBE = """import json, sys
from transformers import AutoTokenizer
t = AutoTokenizer.from_pretrained(sys.argv[1])
ids = t("héllo, world")["input_ids"]
print(json.dumps({"size": len(t), "bos": t.bos_token_id, "eos": t.eos_token_id, "pad": t.pad_token_id,
                  "round_trip": t.decode(ids), "every_id": len(t.convert_ids_to_tokens(list(range(len(t))))),
                  "chat": t.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)}))
"""


def test_tokenizer_vocabulary_is_the_models():
    config = json.loads((MODEL / "config.json").read_text())
    vocab = json.loads((MODEL / "tokenizer.json").read_text())["model"]["vocab"]
    assert sorted(vocab.values()) == list(range(config["vocab_size"]))
    assert [vocab[t] for t in ("<pad>", "<s>", "</s>")] == [config["pad_token_id"], config["bos_token_id"],
                                                             config["eos_token_id"]]


@pytest.mark.parametrize("stack", ["torch_xla", "jax"])
def test_both_stacks_load_it_offline(stack, jax_env):
    python = sys.executable if stack == "torch_xla" else jax_env[PYTHON_ENV]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": "/nonexistent-hf-home"}
    proc = subprocess.run([python, "-c", PROBE, str(MODEL)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    config = json.loads((MODEL / "config.json").read_text())
    assert got["size"] == got["every_id"] == config["vocab_size"]
    assert (got["bos"], got["eos"], got["pad"]) == (config["bos_token_id"], config["eos_token_id"],
                                                    config["pad_token_id"])
    assert got["round_trip"] == "héllo, world"
    assert "hi" in got["chat"]
