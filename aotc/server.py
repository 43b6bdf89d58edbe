"""The stock server of a matrix entry: what a pod runs, as a command line, an environment and a process.

``serve_command`` turns an entry into the stock ``vllm serve`` (API server + engine core, vLLM's default
multiprocessing) of the runner's own interpreter, with the entry's engine flags and env. The runner
supplies its part through ``RunnerSpec.serve`` (engine arguments and environment; on ``device: cpu`` its
CPU twin), so this module names no runner. The canary, the tests and the serving manifests all derive
from it: one list of flags and variables, never copied.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aotc.engine_args import LORA_MODULES, cli_flags, lora_module_words
from aotc.processes import update_env
from aotc.matrix import Entry

# The positional model argument; everything else becomes --flag value.
MODEL_ARG = "model"
# Settings a pod may choose freely: they change no graph and no cache key.
POD_ONLY_ENV = ("AOTC_GUARD",)


@dataclass(frozen=True)
class ServerCommand:
    argv: list[str]
    """``[<runner venv>/bin/vllm, "serve", MODEL, --flag, value, ...]``."""
    env: dict[str, str | None]
    """The variables the entry needs on top of the pod's environment (None: unset)."""
    host: str = "127.0.0.1"
    port: int = 8000

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def model(self) -> str:
        return self.argv[2]

    def process_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        merged = dict(os.environ if base is None else base)
        update_env(merged, self.env)
        return merged


def serve_settings(entry: Entry, cache_dir: str, kv_blocks: int | None = None
                   ) -> tuple[dict[str, Any], dict[str, str | None]]:
    """The runner's engine arguments and env for the stock server, with the matrix's env on top. The KV block
    count is pinned as the build pinned it (fingerprint.pin_kv), or to ``kv_blocks`` (the count a build on the pod's
    hardware recorded in its manifest)."""
    from aotc.fingerprint import pin_kv

    entry = pin_kv(entry, kv_blocks=kv_blocks)
    try:
        args, env = entry.backend.serve(entry, str(cache_dir))
    except NotImplementedError as exc:
        raise ValueError(str(exc)) from None
    env = {**env, **{k: str(v) for k, v in entry.env.items()}}
    args = dict(args)
    if entry.device != "cpu":
        # The twin serves dummy weights (graphs depend on shapes only, and the demo model has none);
        # a TPU pod serves its model's own.
        args.pop("load_format", None)
    return args, env


def vllm_executable(runner: str, environ: Mapping[str, str] | None = None) -> str:
    """The ``vllm`` console script beside the runner's interpreter (its own venv, or this one)."""
    from aotc.runners.spec import runner_python

    return str(Path(runner_python(runner, dict(os.environ if environ is None else environ))).parent / "vllm")


def serve_command(entry: Entry, cache_dir: str | Path, port: int, *, host: str = "127.0.0.1",
                  guard: str | None = "strict", environ: Mapping[str, str] | None = None,
                  lora_modules: Mapping[str, str] | None = None, kv_blocks: int | None = None) -> ServerCommand:
    """The stock ``vllm serve`` for ``entry`` reading its cache from ``cache_dir``; ``lora_modules`` (name ->
    adapter dir) are served besides any the matrix names (pod-only: they change no graph); ``kv_blocks``: see
    ``serve_settings``."""
    args, env = serve_settings(entry, str(cache_dir), kv_blocks)
    if guard is not None:
        env["AOTC_GUARD"] = guard
    served = [f"{name}={path}" for name, path in (lora_modules or {}).items()]
    args[LORA_MODULES] = [*lora_module_words(args.get(LORA_MODULES)), *served]
    flags = cli_flags({key: value for key, value in args.items() if key != MODEL_ARG})
    argv = [vllm_executable(entry.runner, environ), "serve", str(args[MODEL_ARG]), *flags,
            "--host", host, "--port", str(port)]
    return ServerCommand(argv=argv, env=env, host=host, port=port)


# --- a running server ------------------------------------------------------------------------------


class ServerFailed(RuntimeError):
    """The server exited or never answered /health; one line: what happened, the log's cause line, the log."""


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# "(EngineCore pid=7) ERROR 12-04 10:15:29 [core.py:1512] " and the like, before a log line's own words
_LOG_PREFIX = re.compile(r"^(\(\w+ pid=\d+\)\s*)?([A-Z]+ \d\d-\d\d [\d:]+ \[[^]]*\]\s*)?")
_EXCEPTION_LINE = re.compile(r"^[\w.]*(Error|Exception|Exit)\w*: ")


# vLLM's API server ends with a wrapper ("Engine core initialization failed. See root cause above.")
_POINTS_ABOVE = re.compile(r"root cause above|stack trace \(above\)")


def cause_line(log_text: str) -> str:
    """The last exception line of a server log that is not a wrapper pointing above it, else its last line."""
    lines = [_LOG_PREFIX.sub("", _ANSI.sub("", line)).strip() for line in log_text.splitlines()]
    lines = [line for line in lines if line]
    causes = [line for line in lines if _EXCEPTION_LINE.match(line) and not _POINTS_ABOVE.search(line)]
    return causes[-1] if causes else (lines[-1] if lines else "")


@dataclass
class Server:
    command: ServerCommand
    log_path: Path
    process: subprocess.Popen | None = None
    ready_seconds: float | None = None
    started_at: float = field(default_factory=time.monotonic)

    def start(self, base_env: Mapping[str, str] | None = None) -> Server:
        log = open(self.log_path, "ab")
        self.started_at = time.monotonic()
        # Its own session: a clean stop can signal the API server and the engine core it started.
        self.process = subprocess.Popen(self.command.argv, env=self.command.process_env(base_env),
                                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        log.close()
        return self

    def wait_ready(self, timeout: float = 900.0, poll: float = 0.5) -> float:
        """Seconds from start until ``/health`` answered 200."""
        deadline = self.started_at + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerFailed(f"vllm serve exited with {self.process.returncode} before ready: "
                                   f"{self.cause()} (log: {self.log_path})")
            if health(self.command.url):
                self.ready_seconds = time.monotonic() - self.started_at
                return self.ready_seconds
            time.sleep(poll)
        raise ServerFailed(f"vllm serve not ready after {timeout:.0f} s: {self.cause()} (log: {self.log_path})")

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGINT (vLLM's clean shutdown of API server and engine core), then SIGKILL to the group."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        pgid = self.process.pid  # its own session: the group id is its pid
        os.killpg(pgid, signal.SIGINT)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            return self.process.wait(10)
        finally:
            _reap_group(pgid)

    def log_text(self) -> str | None:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return None

    def tail(self, lines: int = 40) -> str:
        return "\n".join((self.log_text() or "").splitlines()[-lines:])

    def cause(self) -> str:
        text = self.log_text()
        return "no log" if text is None else cause_line(text)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _reap_group(pgid: int) -> None:
    """The engine core may outlive its API server by a moment; never leave it running."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def health(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


