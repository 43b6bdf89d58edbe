"""The plan: aotc's padding rules equal vLLM 0.13's own, and the families mirror capture_model."""

import random
from types import SimpleNamespace

import pytest

from aotc.cli import main
from aotc.matrix import parse_matrix
from aotc.plan import plan_entry
from aotc.runners.vllm_tpu.plan import buckets

from ..conftest import CONFIGS


@pytest.fixture(scope="module")
def vllm_rules():
    from vllm.v1.attention.backends.pallas import PallasAttentionBackend
    from vllm.v1.worker import tpu_model_runner as runner

    return SimpleNamespace(token=runner._get_token_paddings, req=runner._get_req_paddings,
                           upper=runner._get_padded_num_reqs_with_upper_limit, min_seqs=runner.MIN_NUM_SEQS,
                           backend=PallasAttentionBackend)


def test_token_paddings_equal_vllms_over_a_random_sweep(vllm_rules):
    rng = random.Random(0)
    gaps = [0, 0, 8, 16, 32, 48, 64, 100, 128, 256, 512]
    cases = [(16, 1 << rng.randint(4, 14), rng.choice(gaps)) for _ in range(200)]
    cases += [(16, rng.randint(1, 16384), rng.choice(gaps)) for _ in range(400)]  # budgets vLLM accepts
    cases += [(16, 16, 0), (16, 17, 0), (16, 8192, 0), (16, 1000, 128), (16, 16, 16), (16, 96, 0), (16, 384, 64)]
    for min_size, max_size, gap in cases:
        assert buckets.token_paddings(min_size, max_size, gap) == vllm_rules.token(min_size, max_size, gap), \
            (min_size, max_size, gap)


def test_request_paddings_equal_vllms_over_a_random_sweep(vllm_rules):
    assert buckets.MIN_NUM_SEQS == vllm_rules.min_seqs
    rng = random.Random(1)
    for max_reqs in [8, 9, 15, 16, 17, 100, 128, 255, 256, 257, 1024] + [rng.randint(8, 4096) for _ in range(300)]:
        assert buckets.req_paddings(8, max_reqs) == vllm_rules.req(8, max_reqs), max_reqs


def test_padded_num_reqs_equal_vllms(vllm_rules):
    rng = random.Random(2)
    for _ in range(500):
        x, limit = rng.randint(1, 5000), rng.randint(1, 5000)
        assert buckets.padded_num_reqs_with_upper_limit(x, limit) == vllm_rules.upper(x, limit), (x, limit)


def test_page_size_and_seq_limit_equal_pallas_backends(vllm_rules):
    for max_model_len in [16, 100, 128, 1000, 2048, 4096, 8192, 8193, 32768, 131072]:
        config = SimpleNamespace(model_config=SimpleNamespace(max_model_len=max_model_len))
        page = vllm_rules.backend.get_page_size(config)
        assert buckets.page_size(max_model_len) == page
        assert buckets.max_num_seqs_for_len(max_model_len, page) == vllm_rules.backend.get_max_num_seqs(
            max_model_len, page)


def entry(text_matrix: str, env: str = "{}"):
    return parse_matrix(f"models: [{{name: m, model: org/m, env: {env}, matrix: {text_matrix}}}]").entries[0]


def test_plan_families_in_capture_model_order():
    plan = plan_entry(entry("{max_model_len: [2048], max_num_seqs: [128], max_num_batched_tokens: [512]}"))
    families = list(dict.fromkeys(g.family for g in plan.graphs))
    assert families == ["backbone", "select_hidden_states", "compute_logits", "structured_decoding",
                        "sample_from_logits", "gather_logprobs"]
    counts = plan.families()
    assert counts["backbone"] == 6  # 16..512
    assert counts["compute_logits"] == 5  # 8..128
    assert counts["sample_from_logits"] == 10  # greedy and random per request bucket
    # select_hidden_states stops at the first request bucket >= min(tokens, max_num_reqs)
    select = [g.shape_dict for g in plan.graphs if g.family == "select_hidden_states"]
    assert [s["num_reqs"] for s in select if s["num_tokens"] == 16] == [8, 16]
    assert [s["num_reqs"] for s in select if s["num_tokens"] == 512] == [8, 16, 32, 64, 128]


def test_most_model_len_adds_a_backbone_variant():
    plain = plan_entry(entry("{max_model_len: [4096], max_num_seqs: [256], max_num_batched_tokens: [256]}"))
    most = plan_entry(entry("{max_model_len: [4096], max_num_seqs: [256], max_num_batched_tokens: [256]}",
                            "{VLLM_TPU_MOST_MODEL_LEN: 1024}"))
    assert most.families()["backbone"] == 2 * plain.families()["backbone"]
    blocks = {g.shape_dict["num_blocks"] for g in most.graphs if g.family == "backbone"}
    assert blocks == {4096 // 256, 1024 // 256}


def test_padding_gap_changes_token_buckets():
    plan = plan_entry(entry("{max_model_len: [2048], max_num_seqs: [8], max_num_batched_tokens: [512]}",
                            "{VLLM_TPU_BUCKET_PADDING_GAP: 128}"))
    assert plan.buckets["token_paddings"] == [16, 32, 64, 128, 256, 384, 512]


def test_plan_json_matches_contract(capsys):
    import json

    assert main(["plan", str(CONFIGS / "example-tpu.yaml"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["total_graphs"] == sum(e["total"] for e in doc["entries"])
    first = doc["entries"][0]
    assert set(first) >= {"entry", "runner", "device", "buckets", "families", "total", "graphs"}
    assert first["graphs"][0] == {"family": "backbone",
                                  "shape": {"num_tokens": 16, "num_reqs": 128, "num_blocks": 16}}


def test_plan_table_for_humans(capsys):
    assert main(["plan", str(CONFIGS / "example-tpu.yaml"), "--entry", "llama31-8b--len2048-seqs128-tok512-tp1"]) == 0
    out = capsys.readouterr().out
    for family in ("backbone", "select_hidden_states", "sample_from_logits", "gather_logprobs", "total"):
        assert family in out


@pytest.mark.parametrize("tokens,gap", [(96, 0), (384, 64), (100, 0), (1000, 128), (8, 0), (384, 0), (200, 48)])
def test_plan_for_any_budget_and_gap_is_what_vllm_compiles(vllm_rules, tokens, gap, capsys, tmp_path):
    """TPUModelRunner compiles every bucket of _get_token_paddings(16, budget, gap), the last one covering a
    budget between buckets; `aotc plan` accepts the budget and plans exactly those."""
    e = entry(f"{{max_model_len: [2048], max_num_seqs: [8], max_num_batched_tokens: [{tokens}]}}",
              f"{{VLLM_TPU_BUCKET_PADDING_GAP: {gap}}}")
    theirs = vllm_rules.token(16, tokens, gap)
    plan = plan_entry(e)
    assert plan.buckets["token_paddings"] == theirs
    assert sorted({g.shape_dict["num_tokens"] for g in plan.graphs if g.family == "backbone"}) == theirs
    config = tmp_path / "m.yaml"
    config.write_text(f"models: [{{name: m, model: org/m, env: {{VLLM_TPU_BUCKET_PADDING_GAP: {gap}}}, "
                      f"matrix: {{max_model_len: [2048], max_num_seqs: [8], max_num_batched_tokens: [{tokens}]}}}}]")
    capsys.readouterr()
    assert main(["plan", str(config), "--json"]) == 0


def test_budget_between_buckets_plans_the_covering_buckets_graphs(vllm_rules):
    """vLLM pads a budget of 96 to the 128 bucket: the graphs are those of a 128 budget."""
    assert vllm_rules.token(16, 96, 0) == vllm_rules.token(16, 128, 0)
    shape = "{{max_model_len: [192], max_num_seqs: [12], max_num_batched_tokens: [{}]}}"
    assert plan_entry(entry(shape.format(96))).graphs == plan_entry(entry(shape.format(128))).graphs


def test_a_hub_config_fetched_after_the_matrix_was_read_meets_the_runners_refusals(tmp_path, monkeypatch):
    """A build reads the matrix, then fetches a hub model's config.json (build.fetch_model_config), then plans:
    the runner's refusals hold for the config it plans from, not only for the one the matrix was read with
    (none, here). vLLM 0.13's TPU runner cannot serve Qwen3-Next's recurrent state."""
    import shutil

    from aotc.errors import BadInput

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    entry, = parse_matrix(f"models: [{{name: m, model: org/qwen3-next, revision: {commit}, runner: vllm-tpu, matrix: "
                          "{max_model_len: [128], max_num_seqs: [8], max_num_batched_tokens: [128]}}]",
                          check_stack=False).entries
    snapshot = tmp_path / "hub" / "models--org--qwen3-next" / "snapshots" / commit
    snapshot.mkdir(parents=True)
    shutil.copy(CONFIGS / "models" / "tiny-qwen3-next" / "config.json", snapshot)  # what the build fetched
    with pytest.raises(BadInput) as refused:
        plan_entry(entry)
    assert str(refused.value).startswith(f"{entry.name}: model: vLLM 0.13's TPU runner cannot serve "
                                         "Qwen3NextForCausalLM")
