"""``vllm serve``'s own argument parser, run in a runner's interpreter: the matrix's ``engine:`` is checked by
the stack that will serve it, never by a hand list of keys.

Run as ``python -m aotc.runners.serve_args`` with ``{"argvs": [[flag, ...], ...], "packages": [dist, ...]}`` on
stdin; prints one JSON line: ``{"results": [{"error": str | None}, ...]}``, or ``{"absent": why}`` when the
interpreter has no vLLM (an init container that only fetches) or lacks one of the stack's packages (its vLLM is
another stack's).
"""

from __future__ import annotations

import argparse
import difflib
import io
import json
import sys
from contextlib import redirect_stderr

# vLLM 0.13 keeps the serve parser in openai/cli_args.py; vLLM-TPU 0.32's vLLM moved it to launchers/.
PARSER_MODULES = ("vllm.entrypoints.openai.cli_args", "vllm.entrypoints.launchers.cli_args")


class ParseError(Exception):
    pass


def serve_parser():
    import importlib

    from vllm.utils.argparse_utils import FlexibleArgumentParser

    for name in PARSER_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        # allow_abbrev off: argparse would take `--max-model-le` for --max-model-len here, where aotc's own
        # readers (build, fingerprint, the runner's rules) know exact names only, and pass it to the server
        parser = module.make_arg_parser(FlexibleArgumentParser(prog="vllm serve", exit_on_error=False,
                                                               allow_abbrev=False))
        parser.error = _raise  # argparse would print usage and exit the process
        return parser
    raise ImportError(f"no vllm serve parser in {', '.join(PARSER_MODULES)}")


def _raise(message: str):
    raise ParseError(message)


def long_options(parser: argparse.ArgumentParser) -> list[str]:
    return [opt for action in parser._actions for opt in action.option_strings if opt.startswith("--")]


def unknown_flag(parser: argparse.ArgumentParser, flag: str) -> str:
    """The complaint for a flag the parser does not know: the full names it abbreviates (argparse's own
    abbreviation matching is off), else the closest name."""
    name = flag.split("=", 1)[0]
    options = long_options(parser)
    expansions = [opt for opt in options if opt.startswith(name)]
    if expansions:
        return (f"unknown argument {name}: an abbreviation of {' or '.join(expansions[:5])}; "
                "engine arguments take exact names only")
    match = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
    return f"unknown argument {name}" + (f" (did you mean {match[0]}?)" if match else "")


def check(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """None if ``vllm serve`` accepts ``argv``, else its own complaint in one line."""
    try:
        with redirect_stderr(io.StringIO()):  # vLLM logs deprecations; the verdict is what counts
            _, unknown = parser.parse_known_args(argv)
    except (ParseError, argparse.ArgumentError, ValueError, TypeError) as exc:
        return " ".join(str(exc).split())
    flags = [word for word in unknown if word.startswith("-")]
    if flags:
        return unknown_flag(parser, flags[0])
    if unknown:
        after = argv[argv.index(unknown[0]) - 1]
        return f"argument {after}: takes no value, got {unknown[0]!r}"
    return None


def missing_packages(packages: list[str]) -> list[str]:
    from importlib import metadata

    missing = []
    for package in packages:
        try:
            metadata.version(package)
        except metadata.PackageNotFoundError:
            missing.append(package)
    return missing


def main() -> None:
    request = json.load(sys.stdin)
    missing = missing_packages(request.get("packages", []))
    if missing:
        print(json.dumps({"absent": f"not the stack's interpreter: no {', '.join(missing)}"}))
        return
    try:
        parser = serve_parser()
    except ImportError as exc:
        print(json.dumps({"absent": str(exc)}))
        return
    # a model first, as `vllm serve MODEL` has one: a stray value must not pass for the model tag
    results = [{"error": check(parser, ["model", *argv])} for argv in request["argvs"]]
    print(json.dumps({"results": results}))


if __name__ == "__main__":
    main()
