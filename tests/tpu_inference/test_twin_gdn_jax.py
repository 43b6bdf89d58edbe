"""The CPU twin's GDN kernel (aotc/runners/tpu_inference/twin/gdn.py), the linear attention of hybrid models, against
a plain numpy loop, in the JAX venv. The TPU kernel cannot run here: its Pallas code does not run in Pallas' TPU
interpret mode either (a reshaped memory ref it uses has no interpreter rule in JAX 0.11), so the reference is the
recurrence written out token by token; the twin hands the recurrence itself to the stack's own JAX reference."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def facts(twin_kernel_facts) -> dict:
    return twin_kernel_facts["gdn_facts.py"]  # one process with moe_facts.py (conftest.py)


def test_the_stack_takes_the_twin_as_its_linear_attention_kernel(facts):
    assert facts["kernel_is_the_twin"]


def test_twin_gdn_equals_the_token_by_token_recurrence(facts):
    """Ragged batches of 1 to 6 sequences, new ones and ones with context, some resuming from another slot:
    the output, and each sequence's conv and recurrent states where the kernel writes them."""
    assert facts["cases"] >= 20
    assert facts["output_error"] < 1e-4 and facts["conv_state_error"] < 1e-5, facts
    assert facts["recurrent_state_error"] < 1e-4, facts


def test_twin_gdn_leaves_other_slots_alone(facts):
    assert facts["untouched_slots_error"] == 0.0, facts
