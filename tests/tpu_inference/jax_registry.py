"""Runs under the JAX venv (tests/tpu_inference/conftest.py: stack_readers): tpu-inference's JAX model registry.

stdout (last line): {architecture: "module.ClassName" of the class the registry maps it to}
"""

import json
import types

from tpu_inference.models.common import model_loader

try:  # the registry fills on its first lookup
    model_loader._get_model_architecture(types.SimpleNamespace(architectures=[]))
except model_loader.UnsupportedArchitectureError:
    pass
print(json.dumps({name: f"{cls.__module__}.{cls.__qualname__}" for name, cls in model_loader._MODEL_REGISTRY.items()}))
