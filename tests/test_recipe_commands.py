"""Every aotc command line the shipped recipes run (configs/k8s, configs/ci) is one aotc's own parser takes.

A recipe is run far from this repository (a pod, a CI runner): a renamed flag or a dropped command would show
there first, as a usage error mid-build. Each line is taken from the recipe as its shell would split it
(tests/helpers/recipes.py) and parsed by ``aotc.cli.build_parser``, the parser ``aotc`` itself runs.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from aotc.cli import UsageError, build_parser
from tests.helpers.recipes import PLACEHOLDER, aotc_calls, calls, recipe_aotc_mentions, recipe_command_lines

from .conftest import CONFIGS, REPO
from .test_images import synced_lock

RECIPES = sorted((CONFIGS / "k8s").glob("*.yaml")) + sorted((CONFIGS / "ci").glob("*.yaml"))


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def command_lines(path: Path):
    # JOB_COMPLETION_INDEX: what Kubernetes sets in an Indexed Job's pod i (here the first)
    return recipe_command_lines(path.name, documents(path), {"JOB_COMPLETION_INDEX": "0"})


LINES = [line for path in RECIPES for line in command_lines(path)]


def test_the_recipes_run_aotc():
    """The extraction finds the commands the recipes are for (a parser that found nothing would pass below)."""
    commands = {line.argv[1] for line in LINES}
    assert {"build", "verify", "publish", "fetch", "completeness", "plan", "canary"} <= commands


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_no_aotc_call_of_a_recipe_is_missed(path: Path):
    """Every `aotc COMMAND` a recipe's scripts and containers hold is one of the lines parsed below."""
    assert len(command_lines(path)) == recipe_aotc_mentions(path.name, documents(path))


@pytest.mark.parametrize("line", LINES, ids=str)
def test_every_aotc_command_line_of_a_recipe_parses_with_the_real_cli(line):
    args = build_parser().parse_args(line.argv[1:])  # UsageError: what `aotc` would exit 2 with
    assert args.command == line.argv[1]
    config = getattr(args, "config", None)
    if config and PLACEHOLDER not in config and not Path(config).is_absolute():  # a CI job's matrix, in the repo
        assert (REPO / config).is_file(), f"{line}: no such matrix {config}"


def test_a_renamed_flag_in_a_recipe_is_caught():
    """The check would fail a recipe whose flag the CLI does not have (here `--shards`, not `--shard`)."""
    [argv] = aotc_calls('aotc build /etc/aotc/matrix.yaml --shards $(JOB_COMPLETION_INDEX)/3 --out "$out"',
                        {"JOB_COMPLETION_INDEX": "0"})
    with pytest.raises(UsageError, match="unrecognized arguments: --shards"):
        build_parser().parse_args(argv[1:])


def test_a_script_is_split_as_sh_splits_it():
    script = """out=/scratch
# aotc build in a comment is not a command
if aotc verify "$out/a" 2>/dev/null; then aotc publish "$out"/*/ --json > "$RUNNER_TEMP/p.json" || status=1; fi
python3 - <<'PY'
aotc plan inside a heredoc is Python's text
PY
aotc completeness "$MATRIX" --store ${{ env.STORE }}"""
    assert aotc_calls(script, {"MATRIX": "m.yaml"}) == [
        ["aotc", "verify", f"{PLACEHOLDER}/a"], ["aotc", "publish", f"{PLACEHOLDER}/*/", "--json"],
        ["aotc", "completeness", "m.yaml", "--store", PLACEHOLDER]]


# --- what a GitHub-hosted runner must be given before `make env` ---------------------------------------------------


def lock_python(lock: Path) -> str:
    """The Python a lock was resolved for, from uv's header (`uv pip compile ... --python-version X`)."""
    [version] = re.findall(r"--python-version (\S+)", "".join(lock.read_text().splitlines(True)[:3]))
    return version


def hosted_jobs() -> list[tuple[str, dict]]:
    return [(f"{path.name}:{name}", job) for path in sorted((CONFIGS / "ci").glob("*.yaml"))
            for workflow in documents(path) for name, job in workflow["jobs"].items()
            if "self-hosted" not in str(job["runs-on"])]


@pytest.mark.parametrize("name, job", hosted_jobs(), ids=[name for name, _ in hosted_jobs()])
def test_a_hosted_runner_gets_the_python_each_lock_it_installs_was_resolved_for(name, job):
    """The Makefile makes each venv with the Python its lock was resolved for (python3.11 for the core's, 3.12 for
    the JAX runner's); a GitHub-hosted Ubuntu 24.04 runner has 3.12 alone on PATH."""
    targets = [word for step in job["steps"] for make in calls(step.get("run", ""), "make", {})
               for word in make[1:] if not word.startswith("-") and "=" not in word]
    provided = {version for step in job["steps"] if "setup-python" in step.get("uses", "")
                for version in str(step["with"]["python-version"]).split()}
    assert targets and {lock_python(REPO / synced_lock(target)) for target in targets} <= provided
