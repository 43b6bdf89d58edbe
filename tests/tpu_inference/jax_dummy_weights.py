"""Runs under the JAX venv (tests/tpu_inference/conftest.py: run_jax): the load format aotc's dummy-weight fix
hands tpu-inference's _get_nnx_model, for targets and drafts that do and do not load through the stack's
iterator loader (LoadableWithIterator), under every format a server can start with.

stdin: {"formats": [...]}
stdout (last line): {"seen": [{"format", "iterator", "draft", "inside", "after"}, ...]}
"""

import json
import sys
from types import SimpleNamespace

from tpu_inference.models.jax.utils.weight_utils import LoadableWithIterator

from aotc.runners.tpu_inference.dummy_weights import loading_on_dummy_formats_fixed


class IteratorLoaded(LoadableWithIterator):
    pass


class SelfLoaded:
    pass


def seen(load_format: str, model_class: type, draft: bool) -> dict:
    config = SimpleNamespace(load_config=SimpleNamespace(load_format=load_format))
    inside = []
    wrapped = loading_on_dummy_formats_fixed(lambda cls, cfg, *a, **k: inside.append(cfg.load_config.load_format))
    wrapped(model_class, config, None, None, is_draft_model=draft)
    return {"format": load_format, "iterator": model_class is IteratorLoaded, "draft": draft, "inside": inside[0],
            "after": config.load_config.load_format}


formats = json.loads(sys.stdin.read())["formats"]
print(json.dumps({"seen": [seen(f, cls, draft) for f in formats for cls in (IteratorLoaded, SelfLoaded)
                           for draft in (False, True)]}))
