"""The matrix: expansion, names, and a corpus of malformed configs, each with its own one-line reason."""

import math
import re
from pathlib import Path

import pytest
import yaml

from aotc.cli import main
from aotc.errors import MatrixError
from aotc.matrix import load_matrix, parse_matrix

from .conftest import CONFIGS

BAD = sorted((Path(__file__).parent / "bad_configs").glob("*.yaml"))

MINIMAL = """
models:
  - name: m
    model: org/model
    matrix: {max_model_len: [128, 256], max_num_seqs: [8, 16], max_num_batched_tokens: [64], tensor_parallel_size: [1, 2]}
"""


def expected_reason(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), path
    return first.removeprefix("# expect: ")


def test_corpus_is_large_and_reasons_distinct():
    assert len(BAD) >= 30
    reasons = [expected_reason(p) for p in BAD]
    assert len(set(reasons)) >= 30


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_malformed_config_rejected_with_one_line(path, capsys):
    code = main(["plan", str(path)])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"aotc: error: {path}"), lines[0]
    assert expected_reason(path) in lines[0]
    assert "Traceback" not in err


def test_missing_config_file_is_bad_input(capsys):
    assert main(["plan", "/nonexistent/matrix.yaml"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_cartesian_expansion_and_stable_names():
    matrix = parse_matrix(MINIMAL)
    assert matrix.names() == [
        "m--len128-seqs8-tok64-tp1", "m--len128-seqs8-tok64-tp2", "m--len128-seqs16-tok64-tp1",
        "m--len128-seqs16-tok64-tp2", "m--len256-seqs8-tok64-tp1", "m--len256-seqs8-tok64-tp2",
        "m--len256-seqs16-tok64-tp1", "m--len256-seqs16-tok64-tp2",
    ]
    assert parse_matrix(MINIMAL).names() == matrix.names()


def test_defaults_apply_and_models_override():
    text = """
defaults: {device: cpu, accelerator: v5e-4, engine: {block_size: 16}, env: {VLLM_TPU_BUCKET_PADDING_GAP: 64}}
models:
  - {name: a, model: x, matrix: {max_model_len: [128], max_num_seqs: [8], max_num_batched_tokens: [64]}}
  - {name: b, model: y, device: tpu, env: {VLLM_TPU_BUCKET_PADDING_GAP: 0}, engine: {max_logprobs: 5},
     matrix: {max_model_len: [128], max_num_seqs: [8], max_num_batched_tokens: [64]}}
"""
    a, b = parse_matrix(text).entries
    assert (a.device, a.accelerator, a.runner, a.dtype) == ("cpu", "v5e-4", "vllm-tpu", "bfloat16")
    assert a.env == {"VLLM_TPU_BUCKET_PADDING_GAP": 64} and a.engine == {"block_size": 16}
    assert b.device == "tpu" and b.env == {"VLLM_TPU_BUCKET_PADDING_GAP": 0}
    assert b.engine == {"block_size": 16, "max_logprobs": 5}


def test_local_model_resolved_relative_to_config():
    matrix = load_matrix(CONFIGS / "demo.yaml")
    entry = matrix.entries[0]
    assert entry.model_path == str((CONFIGS / "models" / "tiny-llama").resolve())
    assert entry.device == "cpu"


def test_example_configs_load():
    raw = yaml.safe_load((CONFIGS / "example-tpu.yaml").read_text())
    example = load_matrix(CONFIGS / "example-tpu.yaml")
    assert example.store == "gs://my-bucket/aotc"
    # one entry per combination of each model's axis values, model by model
    cells = {m["name"]: math.prod(map(len, m["matrix"].values())) for m in raw["models"]}
    assert [e.model_name for e in example.entries] == [name for name, count in cells.items() for _ in range(count)]
    assert all(re.fullmatch("[0-9a-f]{40}", e.revision) for e in example.entries)  # pinned to commits


def test_matrix_error_is_a_value_error():
    with pytest.raises(ValueError) as info:
        parse_matrix("models: []", "x.yaml")
    assert isinstance(info.value, MatrixError)
    assert info.value.file == "x.yaml" and info.value.key_path == "models"


def test_unknown_entry_is_bad_input(capsys):
    assert main(["plan", str(CONFIGS / "demo.yaml"), "--entry", "nope"]) == 2
    assert "no entry named 'nope'" in capsys.readouterr().err


SWEPT = """
models:
  - name: m
    model: org/model
    runner: tpu-inference
    engine: {max-logprobs: 5, enable_prefix_caching: true}
    matrix:
      max_model_len: [128]
      max_num_seqs: [8]
      max_num_batched_tokens: [64]
      async_scheduling: [true, false]
      speculative_config: [{method: ngram, num_speculative_tokens: 2}, {method: ngram, num_speculative_tokens: 4}]
"""


@pytest.mark.needs_jax
def test_any_engine_argument_is_an_axis_of_its_own():
    entries = parse_matrix(SWEPT).entries
    assert [e.name for e in entries] == [
        "m--len128-seqs8-tok64-tp1-async_scheduling.true-speculative_config.1",
        "m--len128-seqs8-tok64-tp1-async_scheduling.true-speculative_config.2",
        "m--len128-seqs8-tok64-tp1-async_scheduling.false-speculative_config.1",
        "m--len128-seqs8-tok64-tp1-async_scheduling.false-speculative_config.2",
    ]
    last = entries[-1].engine
    assert last["async_scheduling"] is False and last["speculative_config"]["num_speculative_tokens"] == 4
    # vLLM's parser reads max-logprobs and max_logprobs alike; so does the matrix
    assert last["max_logprobs"] == 5 and "max-logprobs" not in last


ONLY_VLLM_032_KNOWS = """
models:
  - name: m
    model: org/model
    runner: {runner}
    engine: {{compilation_config: {{cudagraph_mm_encoder: true}}}}
    matrix: {{max_model_len: [128], max_num_seqs: [8], max_num_batched_tokens: [64]}}
"""


def test_a_stacks_arguments_are_not_judged_by_another_stacks_vllm(monkeypatch, tmp_path):
    """Where no venv is named for tpu-inference, its runner's interpreter is this one, whose vLLM is 0.13's: that
    parser does not know vLLM 0.32's keys (cudagraph_mm_encoder) and must not refuse them in tpu-inference's
    name; vLLM 0.13's own runner (vllm-tpu) still has them checked by it."""
    from aotc.runners.spec import load_runner

    monkeypatch.delenv(load_runner("tpu-inference").python_env, raising=False)
    monkeypatch.setenv("AOTC_HOME", str(tmp_path))  # no verdict cached by an earlier run
    assert parse_matrix(ONLY_VLLM_032_KNOWS.format(runner="tpu-inference")).entries
    with pytest.raises(MatrixError, match=r"vllm serve \(vllm-tpu\): .*cudagraph_mm_encoder"):
        parse_matrix(ONLY_VLLM_032_KNOWS.format(runner="vllm-tpu"))


REFUSED_ARGUMENT = """
defaults: {{runner: vllm-tpu, device: cpu, accelerator: v6e-1, dtype: bfloat16}}
models:
  - name: tiny-llama
    model: {model}
    engine: {{max_num_partial_prefills_typo: 2}}
    matrix: {{max_model_len: [128], max_num_seqs: [8], max_num_batched_tokens: [64]}}
"""


ABBREVIATED = """
models:
  - name: m
    model: org/model
    runner: {runner}
    engine: {{{key}: {value}}}
    matrix: {{max_model_len: [128], max_num_seqs: [8], max_num_batched_tokens: [64]}}
"""


def test_a_kept_engine_argument_verdict_is_checked_before_it_is_trusted(tmp_path):
    """`aotc plan` keeps vllm serve's verdicts under $AOTC_HOME/engine-args; one that is not a verdict per
    engine (``[]``, a number) is discarded and the parser asked again: the refused argument stays refused."""
    from .conftest import run_aotc

    config = tmp_path / "m.yaml"
    config.write_text(REFUSED_ARGUMENT.format(model=CONFIGS / "models" / "tiny-llama"))
    home = {"AOTC_HOME": str(tmp_path / "home")}
    first = run_aotc("plan", config, env=home)
    assert first.returncode == 2 and "max_num_partial_prefills_typo" in first.stderr, first.stderr
    [kept] = (tmp_path / "home" / "engine-args").glob("*.json")
    for tampered in ("[]", '[null, null]'):
        kept.write_text(tampered)
        again = run_aotc("plan", config, env=home)
        assert (again.returncode, again.stderr) == (first.returncode, first.stderr), tampered


def test_a_kept_answer_is_keyed_by_aotcs_version_and_the_checkers_source(tmp_path, monkeypatch):
    import aotc
    from aotc.files import answer_path

    checker = tmp_path / "checker.py"
    checker.write_text("v1")
    first = answer_path(tmp_path, {"q": 1}, checker)
    assert answer_path(tmp_path, {"q": 1}, checker) == first
    checker.write_text("v2")  # a fixed checker
    assert answer_path(tmp_path, {"q": 1}, checker) != first
    checker.write_text("v1")
    monkeypatch.setattr(aotc, "__version__", "999.0")
    assert answer_path(tmp_path, {"q": 1}, checker) != first


@pytest.mark.parametrize("key, value, full", [
    ("max_model_le", "4096", "--max-model-len"),
    ("dtyp", "float32", "--dtype"),
    ("enable_lor", "true", "--enable-lora"),  # past vllm-tpu's refusal of LoRA
    ("enable_lor", "false", "--no-enable-lora"),
    ("speculative_confi", "{method: ngram, num_speculative_tokens: 2}", "--speculative-config"),
])
def test_an_abbreviated_engine_argument_is_refused_naming_its_full_name(key, value, full, tmp_path, capsys):
    """argparse takes a prefix for the whole name; build and fingerprint read exact names only, and the server
    would get the prefix and apply it (another length, dtype or feature than the artifact's)."""
    config = tmp_path / "m.yaml"
    config.write_text(ABBREVIATED.format(runner="vllm-tpu", key=key, value=value))
    assert main(["plan", str(config)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert f"models['m'].engine.{key}: vllm serve (vllm-tpu): unknown argument" in lines[0]
    assert f"an abbreviation of {full}" in lines[0]


AXIS = """
models:
  - name: m
    model: org/model
    matrix: {{max_model_len: [128], max_num_seqs: [8], max_num_batched_tokens: [64], {key}: {values}}}
"""


@pytest.mark.parametrize("key, values, index", [
    ("num_gpu_blocks_override", "[-5]", 0),
    ("block_size", "[16, 0]", 1),
    ("max_loras", "[2, 1.5]", 1),
    ("enable_prefix_caching", "[true, 1]", 1),
])
def test_an_engine_argument_axis_value_gets_the_checks_engine_gives_it(key, values, index):
    with pytest.raises(MatrixError) as as_engine:
        parse_matrix(f"models: [{{name: m, model: org/model, engine: {{{key}: {yaml.safe_load(values)[index]!r}}}, "
                     "matrix: {max_model_len: [128], max_num_seqs: [8], max_num_batched_tokens: [64]}}]",
                     check_stack=False)
    with pytest.raises(MatrixError) as as_axis:
        parse_matrix(AXIS.format(key=key, values=values), check_stack=False)
    assert as_axis.value.key_path == f"models['m'].matrix.{key}[{index}]"
    assert as_axis.value.reason == as_engine.value.reason


def test_an_axis_label_keeps_a_numbers_sign():
    # the stack's parser is not the point here (check_stack=False): two values differing by sign are two names
    entries = parse_matrix(AXIS.format(key="num_lookahead_slots", values="[-1, 1, 0.5]"), check_stack=False).entries
    assert [e.name.rpartition("-num_lookahead_slots.")[2] for e in entries] == ["-1", "1", "0.5"]


def test_a_key_given_twice_is_refused_with_its_path_and_line(tmp_path, capsys):
    config = tmp_path / "m.yaml"
    config.write_text("models:\n  - name: m\n    model: org/model\n    matrix:\n      max_model_len: [128]\n"
                      "      max_num_seqs: [8]\n      max_num_batched_tokens: [64]\n      max_num_seqs: [16]\n")
    assert main(["plan", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"aotc: error: {config}: line 8: invalid YAML: duplicate key models[0].matrix.max_num_seqs "
                   "(first at line 6)")
