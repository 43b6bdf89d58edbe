"""A config, an output path or a number a user hands aotc is bounded and checked before it is used: whatever it
is (a device, a FIFO, a YAML alias bomb, a date where a string belongs), the real CLI exits 2 with one line,
never reads forever, never blocks, never writes where it was not told."""

from __future__ import annotations

import json
import os
import stat

import pytest

from .conftest import run_aotc
from .helpers.cli import one_line_error

ENTRY = "m--len128-seqs8-tok64-tp1"


def matrix(engine: str = "", axis: str = "") -> str:
    """One hub model the Hugging Face cache lacks (nothing is read for it), ``engine`` and ``axis`` inline."""
    engine_block = f"\n    engine:\n      {engine}" if engine else ""
    return f"""models:
  - name: m
    model: org/model{engine_block}
    matrix: {{max_model_len: [128], max_num_seqs: [8], max_num_batched_tokens: [64]{axis}}}
"""


# --- the config file: what it is and how big ------------------------------------------------------


@pytest.mark.parametrize("kind", ["character-device", "fifo", "directory"])
@pytest.mark.parametrize("command", ["plan", "fetch"])
def test_a_config_that_is_not_a_regular_file_is_refused_without_reading(kind, command, tmp_path):
    path = {"character-device": "/dev/zero", "directory": str(tmp_path)}.get(kind, str(tmp_path / "fifo"))
    if kind == "fifo":
        os.mkfifo(path)  # nothing ever writes it: opening it to read blocks a reader that waits
    args = ["plan", path] if command == "plan" else [
        "fetch", "--config", path, "--entry", ENTRY, "--dest", str(tmp_path / "d"), "--optional"]
    message = one_line_error(run_aotc(*args, timeout=60), 2)
    assert f"{path}: cannot read: is a " in message and "not a regular file" in message


def test_a_config_larger_than_any_matrix_is_not_read(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text(matrix() + "# padding\n" * 200_000)  # valid YAML, 2 MiB
    assert "larger than 1.0 MiB" in one_line_error(run_aotc("plan", path, timeout=60), 2)


def test_a_yaml_alias_bomb_is_refused_before_it_expands(tmp_path):
    levels = ["l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    levels += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 8)]  # l7: 9**8 = 43 million strings
    path = tmp_path / "bomb.yaml"
    path.write_text(matrix(engine=f"hf_overrides: {{{', '.join(levels)}}}"))
    assert path.stat().st_size < 1000
    message = one_line_error(run_aotc("plan", path, timeout=120), 2)
    assert "expands to more than 100000 values" in message


def test_a_recursive_yaml_alias_is_refused(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text(matrix(engine="hf_overrides: &loop {again: *loop}"))
    assert "recursive" in one_line_error(run_aotc("plan", path, timeout=60), 2)


def test_yaml_nested_deeper_than_a_parser_recurses_is_refused(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text(matrix(engine="hf_overrides: {deep: " + "[" * 100_000 + "]" * 100_000 + "}"))
    assert "invalid YAML" in one_line_error(run_aotc("plan", path, timeout=60), 2)


@pytest.mark.parametrize("engine, key_path", [
    ("code_revision: 2024-01-01", "models[0].engine.code_revision"),  # a YAML date, not the string vLLM reads
    ("code_revision: !!binary aGVsbG8=", "models[0].engine.code_revision"),
    ("hf_overrides: !!set {a, b}", "models[0].engine.hf_overrides"),
    ("hf_overrides: {1: a, b: c}", "models[0].engine.hf_overrides"),
    ("hf_overrides: {yes: 1}", "models[0].engine.hf_overrides"),  # YAML 1.1: the key is the boolean true
])
def test_a_value_json_cannot_hold_is_refused_at_its_key(engine, key_path, tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(matrix(engine=engine))
    message = one_line_error(run_aotc("plan", path, timeout=300), 2)
    assert f"{path}: {key_path}: " in message and "(line 5)" in message


# --- entry names: what plan accepts, a store takes -------------------------------------------------


def test_an_entry_name_a_store_cannot_hold_is_refused_at_plan_and_at_fetch(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(matrix(axis=", served_model_name: [" + "x" * 200 + "]"))
    assert "a store takes at most 200" in one_line_error(run_aotc("plan", path, timeout=300), 2)
    name = f"{ENTRY}-served_model_name.{'x' * 200}"
    fetch = run_aotc("fetch", "--config", path, "--entry", name, "--dest", tmp_path / "d", "--optional",
                     "--store", tmp_path / "store", timeout=120)
    assert "a store takes at most 200" in one_line_error(fetch, 2)


# --- paths aotc writes by rename -------------------------------------------------------------------


@pytest.fixture
def build_dir(tmp_path):
    from aotc.testing.artifacts import make_artifact

    return make_artifact(tmp_path / "artifacts")


@pytest.mark.parametrize("kind", ["fifo", "dangling-symlink", "directory"])
def test_report_out_replaces_only_a_regular_file(kind, build_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    path = out / "report.html"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to(tmp_path / "elsewhere" / "report.html")
    before = os.lstat(path)
    message = one_line_error(run_aotc("report", build_dir, "--out", path, timeout=120), 2)
    assert str(path) in message
    after = os.lstat(path)
    assert (after.st_ino, stat.S_IFMT(after.st_mode)) == (before.st_ino, stat.S_IFMT(before.st_mode))
    assert sorted(os.listdir(out)) == ["report.html"]  # no temp file left beside it
    assert not (tmp_path / "elsewhere").exists()


def test_report_out_through_a_symlink_writes_its_regular_target(build_dir, tmp_path):
    target, link = tmp_path / "kept" / "report.html", tmp_path / "report.html"
    target.parent.mkdir()
    target.write_text("an older report")
    link.symlink_to(target)
    proc = run_aotc("report", build_dir, "--out", link, "--json", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink() and target.read_text().startswith("<!DOCTYPE html>")
    assert sorted(os.listdir(target.parent)) == ["report.html"]


def test_build_never_renames_over_a_link_where_its_artifact_goes(tmp_path):
    from .test_toy_runner import ENTRY, MATRIX, toy

    config, out, elsewhere = tmp_path / "matrix.yaml", tmp_path / "out", tmp_path / "elsewhere"
    config.write_text(MATRIX)
    out.mkdir()
    elsewhere.mkdir()
    (out / ENTRY).symlink_to(elsewhere)
    message = one_line_error(toy("build", config, "--out", out, timeout=300), 2)
    assert f"{out / ENTRY}: is a symlink" in message
    assert (out / ENTRY).is_symlink() and os.listdir(elsewhere) == [] and os.listdir(out) == [ENTRY]


@pytest.mark.parametrize("below", ["", "sub"], ids=["dest-is-the-link", "dest-below-the-link"])
def test_fetch_dest_through_a_link_to_nothing_creates_nothing(below, tmp_path):
    from aotc.manifest import Manifest
    from aotc.testing.artifacts import make_artifact

    artifact, store = make_artifact(tmp_path / "artifacts"), f"file://{tmp_path / 'store'}"
    assert run_aotc("publish", artifact, "--store", store).returncode == 0
    pod, outside = tmp_path / "pod", tmp_path / "outside"
    pod.mkdir()
    (pod / "cache").symlink_to(outside / "target")
    dest = pod / "cache" / below if below else pod / "cache"
    fetch = run_aotc("fetch", "--fingerprint", Manifest.load(artifact).fingerprint, "--dest", dest, "--store", store,
                     "--optional", timeout=120)
    assert "is a symlink to" in one_line_error(fetch, 2)
    assert not outside.exists() and os.listdir(pod) == ["cache"]


# --- numbers and variables the CLI takes -----------------------------------------------------------


@pytest.fixture
def published(tmp_path) -> tuple[str, str]:
    """(store URL, fingerprint) of one published artifact."""
    from aotc.manifest import Manifest
    from aotc.testing.artifacts import make_artifact

    artifact, store = make_artifact(tmp_path / "artifacts"), str(tmp_path / "store")
    assert run_aotc("publish", artifact, "--store", store).returncode == 0
    return store, Manifest.load(artifact).fingerprint


@pytest.mark.parametrize("args, env", [
    (["fetch", "--fingerprint", "a" * 64, "--optional", "--deadline", "inf"], {}),
    (["fetch", "--fingerprint", "a" * 64, "--optional", "--deadline", "nan"], {}),
    (["gc", "--json", "--min-age", "nan"], {}),
    (["gc", "--json", "--dry-run"], {"AOTC_GC_MIN_AGE_SECONDS": "nan"}),
    (["report", "--min-age=-inf"], {}),
    (["break-lease", "--older-than", "nan"], {}),
], ids=["deadline-inf", "deadline-nan", "gc-min-age-nan", "gc-min-age-env-nan", "report-min-age-inf",
        "break-lease-nan"])
def test_a_number_of_seconds_that_is_not_finite_is_refused(args, env, published, tmp_path):
    store, _ = published
    proc = run_aotc(*args, "--store", store, *(["--dest", tmp_path / "d"] if args[0] == "fetch" else []),
                    *(["--out", tmp_path / "r.html"] if args[0] == "report" else []), env=env, timeout=120)
    assert "finite number of seconds" in one_line_error(proc, 2)


def test_a_deadline_longer_than_any_timer_is_no_deadline(published, tmp_path):
    store, fingerprint = published
    proc = run_aotc("fetch", "--fingerprint", fingerprint, "--dest", tmp_path / "d", "--store", store,
                    "--deadline", "1e308", "--json", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["fingerprint"] == fingerprint


def test_an_unknown_require_value_is_refused_with_the_valid_ones(published, tmp_path):
    store, fingerprint = published
    proc = run_aotc("fetch", "--fingerprint", fingerprint, "--dest", tmp_path / "d", "--store", store,
                    env={"AOTC_REQUIRE": "garbage"}, timeout=120)
    message = one_line_error(proc, 2)
    assert "AOTC_REQUIRE" in message and "'garbage'" in message and "1, true, yes" in message
    assert not (tmp_path / "d").exists()


def test_an_http_store_refusing_connections_is_a_warning_with_optional(tmp_path):
    import socket

    from .conftest import CONFIGS

    with socket.socket() as s:  # a port nothing listens on: connections are refused
        s.bind(("127.0.0.1", 0))
        store = f"http://127.0.0.1:{s.getsockname()[1]}/aotc"
    args = ["fetch", "--config", CONFIGS / "demo.yaml", "--entry", "tiny-llama--len128-seqs8-tok64-tp1",
            "--dest", tmp_path / "d", "--store", store]
    optional = run_aotc(*args, "--optional", "--json", timeout=120)
    assert optional.returncode == 0, optional.stderr
    assert json.loads(optional.stdout)["fetched"] is False
    [warning] = optional.stderr.strip().splitlines()
    assert warning.startswith(f"aotc: warning: store {store} did not answer") and "WITHOUT" in warning
    assert store in one_line_error(run_aotc(*args, timeout=120), 1)  # without --optional: a failed check
