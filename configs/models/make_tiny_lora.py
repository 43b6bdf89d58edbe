"""Writes tiny-llama-lora: a random PEFT LoRA adapter (rank 8 on q/k/v/o) for the demo
model configs/models/tiny-llama, seeded, numpy and safetensors only, nothing from a hub. The output (a few
KB) is committed so that matrices and the canary can name it; run again only after changing the shapes.

    python configs/models/make_tiny_lora.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # run as a script from anywhere: aotc from this checkout

from aotc.runners.lora import write_adapter  # noqa: E402

BASE = HERE / "tiny-llama"
OUT = HERE / "tiny-llama-lora"


def main() -> None:
    print(write_adapter(OUT, json.loads((BASE / "config.json").read_text()), rank=8, seed=0))


if __name__ == "__main__":
    main()
