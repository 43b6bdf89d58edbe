"""aotc: compile-ahead XLA cache builder for vLLM on TPUs."""

__version__ = "0.1.0"
