"""Collapsing a stack's prepended flags (aotc/runners/flags.py): every process layout ends with each of the
stack's words once, and with the launch's own words as they were, in their order."""

import pytest

from aotc.runners.flags import collapse_flag_env, collapse_words
from aotc.runners.spec import load_runner

# The stack's own additions, as the tpu-inference runner declares them (tests/tpu_inference pins them to
# tpu_inference/env_override.py).
IMPLIED = load_runner("tpu-inference").stack_flags
LAUNCH = {"XLA_FLAGS": "--xla_dump_to=/tmp/d --xla_cpu_enable_fast_math=false --xla_dump_to=/tmp/d",
          "LIBTPU_INIT_ARGS": "--xla_tpu_enable_async_collective_fusion=true"}


def imported(environ: dict[str, str], times: int) -> dict[str, str]:
    """``environ`` after the stack's import ran ``times`` times over it (one per process that inherited it)."""
    env = dict(environ)
    for _ in range(times):
        for var, words in IMPLIED.items():
            env[var] = " ".join(words) + " " + env.get(var, "")
    return env


def collapsed(environ: dict[str, str]) -> dict[str, str]:
    return {**environ, **collapse_flag_env(environ, IMPLIED)}


@pytest.mark.parametrize("var", ["XLA_FLAGS", "LIBTPU_INIT_ARGS"])
@pytest.mark.parametrize("times", [1, 2, 3])
def test_every_layout_keeps_each_implied_word_once_and_the_launch_words_in_order(var, times):
    env = collapsed(imported(LAUNCH, times))
    assert env[var].split() == [*IMPLIED[var], *LAUNCH[var].split()]


def test_layouts_agree_whatever_the_number_of_imports():
    assert len({tuple(sorted(collapsed(imported(LAUNCH, n)).items())) for n in (1, 2, 3)}) == 1


def test_collapse_is_idempotent():
    once = collapsed(imported(LAUNCH, 2))
    assert collapse_flag_env(once, IMPLIED) == {}
    assert collapsed(once) == once


def test_a_process_that_has_not_imported_the_stack_is_left_alone():
    assert collapse_flag_env(LAUNCH, IMPLIED) == {}
    assert collapse_flag_env({}, IMPLIED) == {}  # unset variables stay unset


def test_a_launch_that_names_an_implied_word_itself_keeps_it_once_at_its_place():
    word = IMPLIED["XLA_FLAGS"][0]
    launch = {"XLA_FLAGS": f"--xla_dump_to=/tmp/d {word}"}
    assert collapsed(imported(launch, 2))["XLA_FLAGS"].split() == ["--xla_dump_to=/tmp/d", word]


def values(words: list[str]) -> dict[str, str]:
    """Each flag's value as XLA parses the words: the last one wins."""
    return {w.split("=")[0]: w for w in words}


@pytest.mark.parametrize("launch", ["--xla_cpu_max_isa=AVX512", "--xla_cpu_max_isa=AVX512 --xla_cpu_max_isa=AVX2",
                                    "--xla_cpu_max_isa=AVX2 --xla_cpu_max_isa=AVX512 --xla_dump_to=/tmp/d"])
def test_collapse_never_changes_a_flags_value(launch):
    for times in (1, 2):
        words = imported({"XLA_FLAGS": launch}, times)["XLA_FLAGS"].split()
        assert values(collapse_words(words, IMPLIED["XLA_FLAGS"])) == values(words)


def test_only_the_changed_variables_are_returned():
    env = imported(LAUNCH, 2)
    env["LIBTPU_INIT_ARGS"] = LAUNCH["LIBTPU_INIT_ARGS"]  # this one never saw the stack
    assert set(collapse_flag_env(env, IMPLIED)) == {"XLA_FLAGS"}
