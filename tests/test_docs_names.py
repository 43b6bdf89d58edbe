"""The docs name only what the code has: the repository paths, the AOTC_* variables, the CLI's commands, flags
and defaults, and the exit codes docs/design.md (the contracts) and the pages beside it state. Read from the
code itself (the CLI's own parser, aotc/errors.py), so a renamed module, flag or variable fails here instead of
leaving the docs behind."""

from __future__ import annotations

import argparse
import ast
import re
import signal
import subprocess
from dataclasses import fields

import pytest

from aotc import errors
from aotc.cli import build_parser
from aotc.guard_metrics import HELP
from aotc.manifest import VerifySummary
from aotc.runners import protocol
from aotc.runners.spec import Planner, RunnerSpec

from .conftest import REPO

DOCS = sorted((REPO / "docs").rglob("*.md")) + [REPO / "CONTRIBUTING.md"]
DESIGN = (REPO / "docs" / "design.md").read_text()
# a path into the tree with a file's extension (a bare `aotc/...` may be an annotation name, not a path)
REPO_PATH = re.compile(r"(?<![\w./-])((?:aotc|tests|configs|bench|docker|requirements|scripts)/[\w./-]*"
                       r"\.(?:py|yaml|yml|lock|toml|json|md|txt))\b")
AOTC_VAR = re.compile(r"\bAOTC_[A-Z0-9_]*[A-Z0-9]")


def section(text: str, title: str) -> str:
    """The body of one `## title` section of a markdown page."""
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def tracked_sources() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "aotc", "tests", "bench", "docker", "configs", "Makefile"],
                            capture_output=True, text=True, cwd=REPO, check=True).stdout.split()
    return [f for f in listed if not f.endswith(".md") and (REPO / f).is_file()]


def source_text(paths: list[str]) -> str:
    return "\n".join((REPO / f).read_text(errors="replace") for f in paths)


def subcommands() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def flags_of(parser: argparse.ArgumentParser) -> set[str]:
    return {opt for action in parser._actions for opt in action.option_strings if opt.startswith("--")} - {"--help"}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_repository_path_a_doc_names_exists(doc):
    missing = sorted({m for m in REPO_PATH.findall(doc.read_text()) if not (REPO / m).exists()})
    assert not missing, f"{doc.name} names paths the tree does not have: {missing}"


def test_every_aotc_variable_the_docs_name_is_one_the_code_reads():
    in_code = set(AOTC_VAR.findall(source_text(tracked_sources())))
    unread = sorted({(doc.name, var) for doc in DOCS for var in AOTC_VAR.findall(doc.read_text())
                     if var not in in_code})
    assert not unread, f"variables the docs name and nothing reads: {unread}"


def test_every_aotc_variable_the_package_reads_is_in_designs_environment_table():
    package = [f for f in tracked_sources() if f.startswith("aotc/") and f.endswith(".py")]
    # a name the code spells as a string is one it reads or sets (docstrings spell names bare, unquoted)
    read = set(re.findall(r"""["'](AOTC_[A-Z0-9_]*[A-Z0-9])["']""", source_text(package)))
    rows = re.findall(r"^\| ((?:[^|]|\\\|)+) \|", section(DESIGN, "Environment"), re.M)  # the variable column
    table = {var for cell in rows for var in AOTC_VAR.findall(cell)}
    assert read and not read - table, f"no row in design.md's Environment table: {sorted(read - table)}"


def synopsis() -> dict[str, set[str]]:
    """design.md's CLI block: each `aotc <command>` with the flags its synopsis lists (continuation lines too)."""
    block = re.search(r"## CLI\n```\n(.*?)```", DESIGN, re.S).group(1)
    commands: dict[str, set[str]] = {}
    current = None
    for line in block.splitlines():
        if m := re.match(r"aotc ([a-z-]+)", line):
            current = m.group(1)
            commands[current] = set()
        if current and not line.startswith("python -m"):
            commands[current] |= set(re.findall(r"--[a-z][a-z-]*", line.split("#")[0]))
    return commands


def test_designs_cli_synopsis_is_the_parsers_commands_and_flags():
    parsers = subcommands()
    documented = synopsis()
    assert set(documented) == set(parsers)
    for name, flags in documented.items():
        assert flags == flags_of(parsers[name]), name


def test_cli_pages_command_table_names_only_real_flags():
    parsers = subcommands()
    for row in re.findall(r"^\| `aotc ([a-z-]+)([^`]*)`", (REPO / "docs" / "cli.md").read_text(), re.M):
        name, rest = row
        assert name in parsers, name
        assert set(re.findall(r"--[a-z][a-z-]*", rest)) <= flags_of(parsers[name]), name


def test_designs_cli_defaults_are_the_parsers():
    """`Defaults: build `--out artifacts --jobs 1`; gc and report `--keep 2`; …`: each against the parser."""
    parsers = subcommands()
    line = re.search(r"^Defaults: (.*?)\. The store", DESIGN, re.M | re.S).group(1)
    checked = 0
    for names, spec in re.findall(r"([a-z -]+?) `([^`]+)`", line.replace("\n", " ")):
        for name in re.split(r" and |, ", names.strip()):
            for flag, value in re.findall(r"(--[a-z-]+) (\S+)", spec):
                action = next(a for a in parsers[name]._actions if flag in a.option_strings)
                assert str(action.default) == value or action.default == float(value), (name, flag)
                checked += 1
    assert checked >= 10


def test_every_exit_code_design_states_is_one_aotc_defines():
    defined = {0, *(v for k, v in vars(errors).items() if k.startswith("EXIT_")),
               128 + signal.SIGINT, 128 + signal.SIGTERM}
    text = section(DESIGN, "Exit codes")
    summary = text.split("\n|")[0]  # "0 ok · 1 a check failed … · 143 terminated …", before the table
    stated = {int(c) for c in re.findall(r"(?:^|· )(\d+)\s", summary, re.M)}
    assert stated == defined
    rows = re.findall(r"^\| ([a-z, -]+) \| (.*) \|$", text, re.M)
    parsers = subcommands()
    assert rows
    for commands, codes in rows:
        if commands == "command":
            continue
        assert all(name in parsers for name in commands.split(", ")), commands
        per_command = {int(c) for group in re.findall(r"(?:^|; )(\d+(?:/\d+)*) ", codes) for c in group.split("/")}
        assert per_command and per_command <= defined - {0}, commands


def fingerprint_keys() -> set[str]:
    """The input names aotc/fingerprint.py writes: dict-literal keys and `inputs[...] =` in the functions that
    build the inputs, read from the source (computing them would start the stack to size the KV cache)."""
    tree = ast.parse((REPO / "aotc" / "fingerprint.py").read_text())
    builders = {"fingerprint_inputs", "model_inputs", "local_model_inputs"}
    keys: set[str] = set()
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in builders):
        for node in ast.walk(fn):
            if isinstance(node, ast.Dict):
                keys |= {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) \
                    and isinstance(node.slice, ast.Constant):
                keys.add(node.slice.value)
    return keys


def test_designs_fingerprint_table_lists_exactly_the_inputs_the_code_hashes():
    first_cells = re.findall(r"^\| (`[^|]+) \|", section(DESIGN, "Fingerprint"), re.M)
    documented = {name for cell in first_cells for name in re.findall(r"`(\w+)`", cell)}
    assert documented == fingerprint_keys()


def test_designs_guard_metrics_are_the_ones_the_guard_publishes():
    named = {re.sub(r"_total$", "", m) for m in re.findall(r"`(aotc_\w+)", section(DESIGN, "Guard (serving pods)"))}
    assert named == set(HELP)


@pytest.mark.parametrize("message, parts", [
    ("Request", ("Request", "PlannedGraph")),
    ("BuildResult", ("BuildResult", "Graph")),
    ("VerifyResult", ("VerifyResult", "FamilyRow", "Missed")),
])
def test_designs_runner_protocol_names_every_field_of_each_message(message, parts):
    bullet = re.search(rf"^- `{message}`:(.*?)(?=^- |\Z)", section(DESIGN, "Runner protocol"), re.M | re.S).group(1)
    fields = {name for part in parts for name in getattr(protocol, part).model_fields}
    unnamed = sorted(f for f in fields if not re.search(rf"`[^`]*\b{f}\b[^`]*`", bullet))
    assert not unnamed, f"design.md's {message} bullet does not name: {unnamed}"


def test_designs_manifest_verify_keys_are_the_summarys():
    example = re.search(r'"verify": \{([^}]*)\}', section(DESIGN, "Manifest (schema 1)")).group(1)
    assert set(re.findall(r'"(\w+)"', example)) == {f.name for f in fields(VerifySummary)}


def table_names(text: str, header: str) -> set[str]:
    """The first identifier of each row's first cell in the table whose header row starts `| header |`."""
    table = re.search(rf"^\| {header} \|.*?\n((?:\|.*\n)+)", text, re.M).group(1)
    return {re.match(r"\| `(\w+)", row).group(1) for row in table.splitlines()[1:] if row.startswith("| `")}


def public_methods(cls: type) -> set[str]:
    return {name for name, value in vars(cls).items()
            if not name.startswith("_") and (callable(value) or isinstance(value, property))}


def test_designs_runner_interface_tables_are_the_specs_fields_hooks_and_planner_methods():
    text = section(DESIGN, "Runner interface")
    assert table_names(text, "field") == {f.name for f in fields(RunnerSpec)}
    # matrix_env() and python_env are told in the rows of env_settable and python()
    assert table_names(text, "hook") == public_methods(RunnerSpec) - {"matrix_env", "python_env"}
    assert table_names(text, "method") == public_methods(Planner)
