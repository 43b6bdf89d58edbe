"""The ``aotc`` command line: thin commands over the library, one output object, one error mapper.

Stdout carries the result (a table, or one JSON document with ``--json``); logs and progress go to
stderr. Errors become one line on stderr and a documented exit code; ``AOTC_DEBUG=1`` shows tracebacks.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from typing import Any

from aotc.processes import exit_now, interrupted_exit_code, sigterm_raises
from aotc.errors import (EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_NOT_FOUND, AotcError, CheckFailed, DeadlineExceeded,
                         NotFoundInStore)

ENV_GC_MIN_AGE = "AOTC_GC_MIN_AGE_SECONDS"
ENV_REQUIRE = "AOTC_REQUIRE"  # fetch --optional: "1" turns a missing artifact back into exit 3


class Output:
    """Where a command's result goes: JSON for machines, rich text for people."""

    def __init__(self, as_json: bool = False):
        self.as_json = as_json

    def status(self, lines: list[str]) -> None:
        """Lines for the operator on stderr, with or without --json (stdout stays the result)."""
        for line in lines:
            print(f"aotc: {line}", file=sys.stderr)

    def emit(self, data: Any, render: Callable[[], None] | None = None) -> None:
        if self.as_json or render is None:
            json.dump(data, sys.stdout, indent=1, sort_keys=True, default=str)
            sys.stdout.write("\n")
        else:
            render()


def console(stderr: bool = False):
    from rich.console import Console

    # piped output keeps whole table rows instead of rich's 80-column default
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, highlight=False, width=None if stream.isatty() else 160)


def progress_enabled() -> bool:
    return sys.stderr.isatty() and not os.environ.get("AOTC_NO_PROGRESS")


# --- commands -------------------------------------------------------------------------------------


def cmd_plan(args: argparse.Namespace, out: Output) -> int:
    from aotc.matrix import load_matrix
    from aotc.plan import plan_entries
    from aotc.render import render_plans

    matrix = load_matrix(args.config)
    plans = plan_entries(matrix.select(args.entry))
    out.emit({"config": args.config, "entries": [p.to_dict() for p in plans],
              "total_graphs": sum(len(p.graphs) for p in plans)},
             lambda: render_plans(plans, console()))
    return 0


def cmd_fingerprint(args: argparse.Namespace, out: Output) -> int:
    from aotc.fingerprint import fingerprint_entry
    from aotc.matrix import load_matrix
    from aotc.render import render_fingerprint

    entry = load_matrix(args.config).entry(args.entry)
    fp = fingerprint_entry(entry)
    out.emit({"entry": entry.name, "fingerprint": fp.digest, "inputs": fp.inputs},
             lambda: render_fingerprint(entry.name, fp, console()))
    return 0


def cmd_build(args: argparse.Namespace, out: Output) -> int:
    from aotc.build import BuildOptions, build_matrix
    from aotc.matrix import load_matrix
    from aotc.render import BuildProgressLines, render_build

    matrix = load_matrix(args.config)
    store = None
    if not args.no_reuse:
        from aotc.store import Store, resolve_store_url

        store = Store.from_url(resolve_store_url(args.store, matrix.store))
    options = BuildOptions(traffic_requests=args.traffic, seed=args.seed, precompile_workers=args.precompile_workers,
                           store=store)
    report = build_matrix(matrix, entries=args.entry, out_dir=args.out, jobs=args.jobs, shard=args.shard,
                          options=options, events=BuildProgressLines())
    out.emit(report.to_dict(), lambda: render_build(report, console()))
    return 0 if report.ok else EXIT_CHECK_FAILED


def cmd_verify(args: argparse.Namespace, out: Output) -> int:
    from aotc.render import render_verify
    from aotc.verify import verify_artifact

    result = verify_artifact(args.artifact_dir, traffic=args.traffic, seed=args.seed)
    out.emit(result.to_dict(), lambda: render_verify(result, console()))
    return 0 if result.ok else EXIT_CHECK_FAILED


def cmd_publish(args: argparse.Namespace, out: Output) -> int:
    from aotc.publish import publish_artifacts
    from aotc.render import progress_bar, render_publish
    from aotc.store import resolve_store_url

    url = resolve_store_url(args.store)
    results = publish_artifacts(args.artifact_dir, url, callback=progress_bar(progress_enabled(), "publish"))
    out.emit({"store": url, "published": [r.to_dict() for r in results]},
             lambda: render_publish(results, url, console()))
    return 0


def cmd_fetch(args: argparse.Namespace, out: Output) -> int:
    from aotc.fetch import DEFAULT_OPTIONAL_DEADLINE, FetchOptions, fetch_artifact, fetch_before
    from aotc.render import progress_bar, render_fetch
    from aotc.store import resolve_store_url, unreachable

    if bool(args.fingerprint) == bool(args.config):
        raise_usage("fetch needs either --config CONFIG --entry NAME or --fingerprint FP")
    entry = None
    config_store = None
    if args.config:
        from aotc.matrix import load_matrix

        if not args.entry:
            raise_usage("fetch --config needs --entry NAME")
        matrix = load_matrix(args.config, check_stack=False)
        entry = matrix.entry(args.entry)
        config_store = matrix.store
    url = resolve_store_url(args.store, config_store)
    optional = not fetch_required() and args.optional  # the variable is checked even where it does not apply
    deadline = args.deadline if args.deadline is not None else (
        DEFAULT_OPTIONAL_DEADLINE if args.optional else None)
    if deadline is not None and deadline <= 0:
        raise_usage("fetch --deadline must be > 0 seconds")
    options = FetchOptions(progress=progress_bar(progress_enabled(), "fetch"), cache=node_cache(args),
                           deadline=deadline)
    try:
        fetch = fetch_before if deadline else fetch_artifact
        result = fetch(url, args.dest, entry, args.fingerprint, options)
    except KeyboardInterrupt as exc:
        if fetch is fetch_before:  # its thread is abandoned (its staging dir removed): exit without joining it
            print("aotc: interrupted", file=sys.stderr)
            exit_now(interrupted_exit_code(exc))
        raise
    except NotFoundInStore as exc:
        abandoned = isinstance(exc, DeadlineExceeded)  # a stalled thread is left: exit without joining it
        if not optional:
            if not abandoned:
                raise
            print(f"aotc: error: {exc}", file=sys.stderr)
            exit_now(exc.exit_code)
        code = continue_without_artifact(str(exc), args.dest, out)
        if abandoned:
            exit_now(code)
        return code
    except Exception as exc:
        if not unreachable(exc):
            raise
        if not optional:
            raise CheckFailed(f"store {url} did not answer: {exc}") from exc
        return continue_without_artifact(f"store {url} did not answer: {exc}", args.dest, out)
    out.emit(result.to_dict(), lambda: render_fetch(result, console()))
    return 0


def node_cache(args: argparse.Namespace) -> Any:
    """--cache-dir / $AOTC_CACHE_DIR (none by default); size bound --cache-max-size / $AOTC_CACHE_MAX_SIZE."""
    from aotc.render import warn
    from aotc.store.cache import (DEFAULT_MAX_SIZE, ENV_CACHE_DIR, ENV_CACHE_MAX_SIZE, NodeCache, parse_size,
                                  unusable)

    root = args.cache_dir or os.environ.get(ENV_CACHE_DIR)
    if not root:
        return None
    size = args.cache_max_size or os.environ.get(ENV_CACHE_MAX_SIZE)
    max_size = parse_size(size) if size else DEFAULT_MAX_SIZE
    try:
        return NodeCache(root, max_size)
    except OSError as exc:
        if not unusable(exc):  # not a directory: a mistake in the command
            raise_usage(f"--cache-dir {root}: {exc.strerror or exc}")
        warn(f"node cache {root}: {exc.strerror or exc}; fetching from the store")  # read-only, full
        return None


def fetch_required() -> bool:
    value = os.environ.get(ENV_REQUIRE, "").strip().lower()
    if value not in ("", "0", "1", "true", "false", "yes", "no"):
        raise_usage(f"${ENV_REQUIRE} must be one of 1, true, yes (a missing artifact fails) or 0, false, no, "
                    f"unset (fetch --optional continues), got {value!r}")
    return value in ("1", "true", "yes")


def continue_without_artifact(reason: str, dest: str, out: Output) -> int:
    """fetch --optional: a pod starts and compiles, and its log says so once, loudly."""
    print(f"aotc: warning: {reason}; continuing WITHOUT a compiled cache in {dest}: vLLM compiles every graph "
          f"at start-up (fetch --optional; {ENV_REQUIRE}=1 makes this fatal)", file=sys.stderr)
    if out.as_json:
        out.emit({"fetched": False, "dest": dest, "reason": reason})
    return 0


def cmd_ls(args: argparse.Namespace, out: Output) -> int:
    from aotc.render import print_warnings, render_ls
    from aotc.store import Store, resolve_store_url, scan_store

    url = resolve_store_url(args.store)
    info = scan_store(Store.from_url(url))
    print_warnings(info.warnings)
    out.emit(info.to_dict(), lambda: render_ls(info, console()))
    return 0


def cmd_gc(args: argparse.Namespace, out: Output) -> int:
    from aotc.render import print_warnings, render_gc
    from aotc.store import Store, resolve_store_url, scan_store

    url = resolve_store_url(args.store)
    store = Store.from_url(url)
    min_age = gc_min_age(args)
    strategy = scan_store(store).gc(keep=args.keep, min_age=min_age)
    print_warnings(strategy.warnings)
    report = None if args.dry_run else strategy.execute(store)
    out.emit(strategy.to_dict() | {"dry_run": args.dry_run, "store": url,
                                   "report": report.to_dict() if report else None},
             lambda: render_gc(strategy, args.dry_run, console(), report))
    return 0


def cmd_break_lease(args: argparse.Namespace, out: Output) -> int:
    from aotc.render import lease_lines
    from aotc.store import Store, resolve_store_url
    from aotc.store.leases import break_leases

    if args.older_than < 0:
        raise_usage("break-lease needs --older-than >= 0")
    url = resolve_store_url(args.store)
    store = Store.from_url(url)
    store.require()
    decisions = break_leases(store, kind=args.kind, older_than=args.older_than, force=args.force)
    out.status(lease_lines(decisions))
    if out.as_json:
        out.emit({"store": url, "removed": [d.to_dict() for d in decisions if d.removed],
                  "refused": [d.to_dict() for d in decisions if not d.removed]})
    return EXIT_CHECK_FAILED if any(not d.removed for d in decisions) else 0


def cmd_completeness(args: argparse.Namespace, out: Output) -> int:
    from aotc.completeness import check_completeness
    from aotc.render import completeness_lines

    report = check_completeness(args.config, args.store)
    out.status(completeness_lines(report))
    if out.as_json:
        out.emit(report.to_dict())
    return EXIT_NOT_FOUND if report.missing else 0


def gc_min_age(args: argparse.Namespace) -> float:
    """gc's --min-age, else $AOTC_GC_MIN_AGE_SECONDS, else the store's default; --keep checked too."""
    from aotc.store import DEFAULT_MIN_AGE

    # blobs younger than this may belong to a publish in flight (see aotc/store/leases.py)
    min_age = args.min_age
    if min_age is None:
        try:
            min_age = finite_seconds(os.environ.get(ENV_GC_MIN_AGE, str(DEFAULT_MIN_AGE)))
        except argparse.ArgumentTypeError as exc:
            raise_usage(f"${ENV_GC_MIN_AGE}: {exc}")
    if args.keep < 0 or min_age < 0:
        raise_usage(f"{args.command} needs --keep >= 0 and --min-age >= 0")
    return min_age


def cmd_report(args: argparse.Namespace, out: Output) -> int:
    from aotc.report import build_report, html_build, html_store, store_report, write_report
    from aotc.store import resolve_store_url

    if args.artifact_dir and args.store:
        raise_usage("report takes either ARTIFACT_DIR... or --store URL, not both")
    if args.artifact_dir:
        data = build_report(args.artifact_dir)
        kind, text, entries = "build", html_build(data), len(data.entries)
    else:
        url = resolve_store_url(args.store)
        store = store_report(url, keep=args.keep, min_age=gc_min_age(args))
        kind, text, entries = "store", html_store(store), len(store.info.entries)
    path = write_report(text, args.out)
    out.emit({"report": str(path), "kind": kind, "entries": entries},
             lambda: print(f"aotc report: wrote {path} ({kind}, {entries} entries)"))
    return 0


def cmd_doctor(args: argparse.Namespace, out: Output) -> int:
    from aotc.doctor import run_doctor
    from aotc.render import render_doctor

    report = run_doctor()
    out.emit(report, lambda: render_doctor(report, console()))
    return 0 if report.get("ok", True) else EXIT_CHECK_FAILED


def cmd_canary(args: argparse.Namespace, out: Output) -> int:
    from aotc.canary import run_canary
    from aotc.render import render_canary
    from aotc.matrix import load_matrix
    from aotc.store import resolve_store_url

    if args.requests < 1:
        raise_usage("canary --requests must be at least 1")
    url = resolve_store_url(args.store, load_matrix(args.config).store)
    result = run_canary(args.config, args.entry, url, requests=args.requests, seed=args.seed, work_dir=args.work_dir)
    out.emit(result.to_dict(), lambda: render_canary(result, console()))
    return 0 if result.ok else EXIT_CHECK_FAILED


# --- parser ---------------------------------------------------------------------------------------


class UsageError(AotcError):
    exit_code = EXIT_BAD_INPUT


def raise_usage(message: str) -> None:
    raise UsageError(message)


PROG = "aotc"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 too; keep the one-line form
        # main prints "aotc: error: " once; a subcommand's parser adds its own name ("aotc ls" -> "ls: ")
        command = self.prog.removeprefix(PROG).strip()
        raise UsageError(f"{command}: {message}" if command else message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Compile-ahead XLA cache builder for vLLM on TPUs.",
                     epilog=f"{PROG} COMMAND -h: that command's arguments")
    parser.add_argument("--version", action="version", version=_version())
    # not required: a bare `aotc` gets the command list (main), not a one-line "required: command"
    sub = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND", parser_class=_Parser)

    def command(name: str, func: Callable, help_text: str, json_flag: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(func=func)
        if json_flag:
            p.add_argument("--json", action="store_true", help="write one JSON document to stdout")
        return p

    p = command("plan", cmd_plan, "list every graph each entry needs, before compiling anything")
    p.add_argument("config")
    p.add_argument("--entry", action="append", metavar="NAME", help="only this entry (repeatable)")

    p = command("build", cmd_build, "compile every planned graph (and a traffic sweep) into artifact dirs")
    p.add_argument("config")
    p.add_argument("--entry", action="append", metavar="NAME")
    p.add_argument("--out", default="artifacts", metavar="DIR")
    p.add_argument("--jobs", type=int, default=1, metavar="N")
    p.add_argument("--shard", default=None, metavar="I/N")
    p.add_argument("--traffic", type=int, default=32, metavar="N", help="requests in the traffic sweep")
    p.add_argument("--seed", type=int, default=0, metavar="S")
    p.add_argument("--store", default=None, metavar="URL",
                   help="take entries this store holds as built, reuse its compatible artifacts' graphs "
                        "(default: as publish resolves it)")
    p.add_argument("--no-reuse", action="store_true",
                   help="build every entry, compile every graph: nothing taken or seeded from a store")
    p.add_argument("--precompile-workers", type=int, default=None, metavar="N",
                   help="the backend's parallel precompile (tpu-inference: NUM_PRECOMPILE_WORKERS)")

    p = command("verify", cmd_verify, "prove, in a fresh process, that no graph misses the cache")
    p.add_argument("artifact_dir")
    p.add_argument("--traffic", type=int, default=64, metavar="N")
    p.add_argument("--seed", type=int, default=1, metavar="S")

    p = command("publish", cmd_publish, "put artifacts in the store, atomically")
    p.add_argument("artifact_dir", nargs="+")
    p.add_argument("--store", metavar="URL")

    p = command("fetch", cmd_fetch, "download a verified artifact into DIR (a pod's init container)")
    p.add_argument("--config")
    p.add_argument("--entry")
    p.add_argument("--fingerprint", metavar="FP")
    p.add_argument("--dest", required=True, metavar="DIR")
    p.add_argument("--store", metavar="URL")
    p.add_argument("--optional", action="store_true",
                   help=f"exit 0 when nothing is published for this engine, unless ${ENV_REQUIRE}=1")
    p.add_argument("--deadline", type=finite_seconds, default=None, metavar="SECONDS",
                   help="give up after this long: exit 3, or 0 with --optional (default with --optional: 600)")
    p.add_argument("--cache-dir", metavar="DIR",
                   help="node-local object cache shared by fetches on this node (env AOTC_CACHE_DIR)")
    p.add_argument("--cache-max-size", metavar="SIZE",
                   help="evict least-recently-used objects above this (e.g. 50G, the default; "
                        "env AOTC_CACHE_MAX_SIZE)")

    p = command("ls", cmd_ls, "list entries, fingerprints, sizes and dates in the store")
    p.add_argument("--store", metavar="URL")

    p = command("gc", cmd_gc, "delete all but the newest N fingerprints per entry", json_flag=True)
    p.add_argument("--store", metavar="URL")
    p.add_argument("--keep", type=int, default=2, metavar="N")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--min-age", type=finite_seconds, default=None, metavar="SECONDS",
                   help="never delete an unreferenced object younger than this (default 3600; "
                        "env AOTC_GC_MIN_AGE_SECONDS)")

    p = command("break-lease", cmd_break_lease,
                "remove a stale lease a killed gc (or publish) left, which blocks publishes (or gc)")
    p.add_argument("--store", metavar="URL")
    p.add_argument("--kind", choices=("gc", "publish"), default="gc")
    p.add_argument("--older-than", type=finite_seconds, default=0.0, metavar="SECONDS",
                   help="only leases at least this old (default 0: all of that kind)")
    p.add_argument("--force", action="store_true",
                   help="remove even a lease whose holder may be alive (running on this host, or younger than "
                        "the TTL on another); a live gc whose lease is broken may delete what a publish needs")

    p = command("completeness", cmd_completeness, "is every entry of a matrix published? exit 0 yes, 3 no")
    p.add_argument("config")
    p.add_argument("--store", metavar="URL")
    p = command("report", cmd_report, "write one self-contained HTML page about a build or a store")
    p.add_argument("artifact_dir", nargs="*", help="artifact dirs of a build (else the store: --store URL)")
    p.add_argument("--store", metavar="URL")
    p.add_argument("--out", default="aotc-report.html", metavar="FILE.html")
    p.add_argument("--keep", type=int, default=2, metavar="N", help="store: the gc --keep N to preview")
    p.add_argument("--min-age", type=finite_seconds, default=None, metavar="SECONDS", help="store: as gc --min-age")

    p = command("fingerprint", cmd_fingerprint, "print an entry's fingerprint and its inputs")
    p.add_argument("config")
    p.add_argument("--entry", required=True, metavar="NAME")

    p = command("canary", cmd_canary, "what a pod runs: fetch, the stock vllm serve, vLLM's load generator; "
                "exit 1 naming each graph compiled that the cache lacks")
    p.add_argument("config")
    p.add_argument("--entry", required=True, metavar="NAME")
    p.add_argument("--store", metavar="URL")
    p.add_argument("--requests", type=int, default=64, metavar="N", help="prompts for vllm bench serve")
    p.add_argument("--seed", type=int, default=0, metavar="S")
    p.add_argument("--work-dir", metavar="DIR", help="keep the fetched cache, server and bench logs here")

    command("doctor", cmd_doctor, "versions, this environment's fingerprint inputs, a loadability probe")
    return parser


def finite_seconds(text: str) -> float:
    """A number of seconds: finite, since nan prints as NaN in --json (not JSON) and inf overflows a timer."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds, got {text!r}")
    return value


def _version() -> str:
    from aotc import __version__

    return f"aotc {__version__}"


def _error_code(exc: BaseException) -> int:
    if isinstance(exc, AotcError):
        return exc.exit_code
    if isinstance(exc, FileNotFoundError):
        return EXIT_NOT_FOUND
    if isinstance(exc, (ValueError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return EXIT_BAD_INPUT
    return EXIT_CHECK_FAILED


def setup_logging(debug: bool) -> None:
    """Library warnings become one ``aotc: warning:`` line; third-party error logs (gcsfs logs full
    tracebacks while it retries) stay quiet, since the failure reaches the one error line anyway."""
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s" if debug else "aotc: warning: %(message)s"))
    if not debug:
        handler.addFilter(_one_line_from_aotc)
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, handlers=[handler], force=True)
    if not debug:
        logging.getLogger("gcsfs").setLevel(logging.CRITICAL + 1)


def _one_line_from_aotc(record: Any) -> bool:
    record.exc_info = record.exc_text = None  # no tracebacks without AOTC_DEBUG
    return record.name.startswith("aotc")


def main(argv: list[str] | None = None) -> int:
    debug = bool(os.environ.get("AOTC_DEBUG"))
    setup_logging(debug)
    with sigterm_raises():  # a pod deleted mid-command cleans up as Ctrl-C does
        try:
            parser = build_parser()
            args = parser.parse_args(argv)
            if args.command is None:  # bare `aotc`: what a newcomer needs is the command list
                parser.print_help(sys.stderr)
                return EXIT_BAD_INPUT
            return args.func(args, Output(getattr(args, "json", False)))
        except KeyboardInterrupt as exc:
            print("aotc: interrupted", file=sys.stderr)
            return interrupted_exit_code(exc)
        except BrokenPipeError:  # `aotc plan ... | head`: the reader left; that is not an error
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        except Exception as exc:  # one place maps every failure to one line and an exit code
            if debug:
                raise
            from aotc.render import one_line

            code = _error_code(exc)
            print(f"aotc: error: {one_line(str(exc) or type(exc).__name__)}", file=sys.stderr)
            return code


if __name__ == "__main__":
    sys.exit(main())
