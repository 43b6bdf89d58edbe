"""Which slow tests prove which matrix entry builds, verifies with 0 misses and is served by the stock server:
the source docs/support.md's generated table is made from (tests/support_table.py), and the case lists the
slow tests themselves parametrize over where a test covers only part of its matrix. Stack-free: the generator
and its fast test read it on the core venv alone.

An entry's row follows its matrix (configs/*.yaml): a matrix entry added, renamed or removed changes the table,
and tests/test_support_table.py fails until `make support-table` writes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aotc.matrix import Entry, load_matrix

REPO = Path(__file__).resolve().parent.parent

# The stock server for one MoE model of each path a canary reaches differently (the reasons beside
# tests/tpu_inference/test_zoo_jax.py's canary test); every zoo entry builds and verifies.
ZOO_JAX_CANARIES = ("llama4", "qwen3-next-prefix", "deepseek-v3", "qwen3_5-moe-mtp")
# async-off is not built: the ngram entry (async scheduling off too) plans every graph it does
# (tests/tpu_inference/test_features_jax.py: test_feature_plans_name_what_the_engine_compiles).
FEATURES_JAX_BUILT = ("ngram", "eagle3", "mtp", "gemma4-mtp", "dflash", "dp2")
# Qwen3-VL's stock server is its MoE's (the same tower, budget manager and serving fixes).
MULTIMODAL_JAX_WITHOUT_CANARY = ("qwen3-vl",)


@dataclass(frozen=True)
class Check:
    """One slow test over a matrix's entries: ``ids`` is how its parametrization names an entry's case (a
    format over the entry's ``name`` and ``model_name``), None for a test of one entry."""

    test: str  # tests/<path>.py::<function>
    ids: str | None = "{name}"

    def node_id(self, entry: Entry) -> str:
        if self.ids is None:
            return self.test
        return f"{self.test}[{self.ids.format(name=entry.name, model_name=entry.model_name)}]"

    @property
    def module(self) -> str:
        return self.test.split("::")[0]

    @property
    def function(self) -> str:
        return self.test.split("::")[1]


@dataclass(frozen=True)
class Suite:
    """A matrix and the tests that build, verify and serve its entries. ``built`` and ``served`` name the
    entries (by model name) those tests cover, None for every entry of the matrix (every built one)."""

    matrix: str  # configs/<name>.yaml
    build: Check
    verify: Check
    canary: Check | None = None
    built: tuple[str, ...] | None = None
    served: tuple[str, ...] | None = None
    not_served: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return Path(self.matrix).stem

    def entries(self) -> tuple[Entry, ...]:
        return load_matrix(REPO / self.matrix, check_stack=False).entries

    def is_built(self, entry: Entry) -> bool:
        return self.built is None or entry.model_name in self.built

    def is_served(self, entry: Entry) -> bool:
        return (self.canary is not None and self.is_built(entry) and entry.model_name not in self.not_served
                and (self.served is None or entry.model_name in self.served))

    def checks(self, entry: Entry) -> dict[str, Check]:
        """The stages this suite proves for ``entry``: build, verify, canary."""
        stages = {"build": self.build, "verify": self.verify, "canary": self.canary}
        return {stage: check for stage, check in stages.items() if check and self.is_built(entry)
                and (stage != "canary" or self.is_served(entry))}


TPU = "tests/tpu_inference"
VLLM_TPU = "tests/vllm_tpu"
SUITES = (
    Suite("configs/demo-jax.yaml",
          Check(f"{TPU}/test_build_verify_jax.py::test_build_verifies_with_zero_misses_and_real_loads", None),
          Check(f"{TPU}/test_build_verify_jax.py::test_build_verifies_with_zero_misses_and_real_loads", None),
          Check(f"{TPU}/test_build_verify_jax.py::test_canary_stock_server_loads_every_graph_and_compiles_nothing",
                None)),
    Suite("configs/zoo-jax.yaml",
          Check(f"{TPU}/test_zoo_jax.py::test_zoo_entry_builds_every_planned_graph_and_only_those", "{model_name}"),
          Check(f"{TPU}/test_zoo_jax.py::test_zoo_entry_verifies_with_zero_misses_and_real_loads", "{model_name}"),
          Check(f"{TPU}/test_zoo_jax.py::test_moe_entry_canary_stock_server_compiles_nothing_after_ready",
                "{model_name}"),
          served=ZOO_JAX_CANARIES),
    Suite("configs/features-jax.yaml",
          Check(f"{TPU}/test_features_jax.py::"
                "test_feature_entry_builds_every_planned_graph_and_verifies_with_zero_misses"),
          Check(f"{TPU}/test_features_jax.py::"
                "test_feature_entry_builds_every_planned_graph_and_verifies_with_zero_misses"),
          Check(f"{TPU}/test_features_jax.py::test_feature_canary_compiles_nothing_after_ready"),
          built=FEATURES_JAX_BUILT),
    Suite("configs/multimodal-jax.yaml",
          Check(f"{TPU}/test_multimodal_jax.py::test_multimodal_entry_builds_every_planned_graph_and_only_those"),
          # its parametrization pairs each entry with its seeds, which name no case: "<entry name>-"
          Check(f"{TPU}/test_multimodal_jax.py::test_multimodal_entry_verifies_with_zero_misses_under_image_traffic",
                "{name}-"),
          Check(f"{TPU}/test_multimodal_jax.py::test_multimodal_canary_stock_server_compiles_nothing_after_ready"),
          not_served=MULTIMODAL_JAX_WITHOUT_CANARY),
    Suite("configs/long-prompts-jax.yaml",
          Check(f"{TPU}/test_beyond_warmup_jax.py::test_beyond_warmup_graphs_are_built_verified_and_served", None),
          Check(f"{TPU}/test_beyond_warmup_jax.py::test_beyond_warmup_graphs_are_built_verified_and_served", None),
          Check(f"{TPU}/test_beyond_warmup_jax.py::test_beyond_warmup_graphs_are_built_verified_and_served", None)),
    Suite("configs/demo.yaml",
          Check("tests/vllm_tpu/test_e2e.py::test_build_writes_a_manifest_that_accounts_for_every_file", None),
          Check("tests/vllm_tpu/test_e2e.py::test_verify_covers_everything_and_says_it_did_not_load", None),
          Check("tests/vllm_tpu/test_e2e.py::test_canary_names_a_deleted_graph_and_counts_recompiles_under_loadability",
                None)),
    Suite("configs/zoo-vllm-tpu.yaml",
          Check(f"{VLLM_TPU}/test_zoo.py::test_zoo_entry_builds_every_planned_graph"),
          Check(f"{VLLM_TPU}/test_zoo.py::test_zoo_entry_verifies_with_zero_misses_on_another_seed")),
    Suite("configs/multimodal-vllm-tpu.yaml",
          Check(f"{VLLM_TPU}/test_multimodal.py::test_build_compiles_every_planned_graph", None),
          Check(f"{VLLM_TPU}/test_multimodal.py::test_verify_with_images_misses_nothing_on_another_seed", None),
          Check(f"{VLLM_TPU}/test_multimodal.py::test_canary_stock_server_serves_images_with_nothing_missing", None)),
)


def stages_of_tests() -> dict[str, list[tuple[Suite, Entry, str]]]:
    """Each evidence node id: the suite, entry and stages it proves (one test may prove build and verify)."""
    found: dict[str, list[tuple[Suite, Entry, str]]] = {}
    for suite in SUITES:
        for entry in suite.entries():
            for stage, check in suite.checks(entry).items():
                found.setdefault(check.node_id(entry), []).append((suite, entry, stage))
    return found
