"""The CPU twin's MoE kernels (aotc/runners/tpu_inference/twin/moe.py) against references, in the JAX venv.

The TPU kernels cannot run here (that is why the twin exists), so the references are tokamax's own
fused-activation epilogue, a plain numpy grouped matmul, and a dense per-expert MoE for tpu-inference's
whole fused_moe_func.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def facts(twin_kernel_facts) -> dict:
    return twin_kernel_facts["moe_facts.py"]  # one process with gdn_facts.py (conftest.py)


def test_grouped_matmul_multiplies_each_row_by_its_groups_weights_on_this_shard(facts):
    assert facts["gmm_error"] < 1e-4
    assert facts["gmm_foreign_rows"] == 0.0, "rows of groups another expert shard holds must stay zero"


def test_fused_activation_equals_tokamax_epilogue(facts):
    assert facts["activation_error"] and all(err < 1e-5 for err in facts["activation_error"].values()), \
        facts["activation_error"]


def test_tpu_inference_fused_moe_through_the_twin_equals_dense_per_expert_moe(facts):
    assert facts["moe_error"] < 1e-4
