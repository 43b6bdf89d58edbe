"""A stock ``vllm serve`` for a matrix entry on the CPU twin: API server + engine-core process, as vLLM defaults.

Minimal local launcher for the guard's server tests and the start-up bench, until the shared launcher
(issue 9 item 1, branch i9-canary) lands. Flags and env come from each runner's engine module, minus what
only aotc's in-process engine needs (VLLM_ENABLE_V1_MULTIPROCESSING=0, NUM_PRECOMPILE_WORKERS=1).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

IN_PROCESS_ONLY = ("VLLM_ENABLE_V1_MULTIPROCESSING", "NUM_PRECOMPILE_WORKERS")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli_flags(args: dict) -> list[str]:
    """vllm.LLM keyword arguments as ``vllm serve`` flags (the model is positional)."""
    flags: list[str] = []
    for key, value in args.items():
        if key == "model" or value is None or value is False:
            continue
        flags.append("--" + key.replace("_", "-"))
        if value is not True:
            flags.append(str(value))
    return flags


def stock_command(entry: dict, cache_dir: str, port: int) -> tuple[list[str], dict[str, str | None]]:
    """(argv, env changes) of ``vllm serve`` for ``entry`` (a matrix Entry's dict with model_path)."""
    if entry["runner"] == "tpu-inference":
        from aotc.runners.tpu_inference import engine

        python = os.environ.get("AOTC_PYTHON_TPU_INFERENCE") or sys.executable
        args, env = engine.engine_args(entry), engine.runtime_env(entry, cache_dir)
    else:
        from aotc.runners.vllm_tpu import engine

        python = sys.executable
        args, env = engine.engine_args(entry, seed=0), engine.runtime_env(entry, cache_dir)
    args.pop("disable_log_stats", None)  # a pod keeps vLLM's stats: they feed /metrics
    for key in IN_PROCESS_ONLY:
        env[key] = None
    argv = [python, "-m", "vllm.entrypoints.cli.main", "serve", args["model"], "--host", "127.0.0.1",
            "--port", str(port), *cli_flags(args)]
    return argv, env


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    log: Path
    started: float
    timings: dict = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def guard_lines(self) -> list[str]:
        return [line for line in self.text().splitlines() if "aotc guard:" in line]

    def wait_ready(self, timeout: float = 900) -> float:
        """Seconds from launch to /health 200."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited {self.proc.returncode}:\n{self.text()[-4000:]}")
            try:
                if get(self.url + "/health", timeout=5)[0] == 200:
                    return time.monotonic() - self.started
            except OSError:
                pass
            time.sleep(0.25)
        raise TimeoutError(f"vllm serve not ready after {timeout}s:\n{self.text()[-4000:]}")

    def complete(self, prompt: list[int], **params) -> tuple[int, dict]:
        body = {"model": self.model, "prompt": prompt, "max_tokens": 4, **params}
        return post(self.url + "/v1/completions", body)

    @property
    def model(self) -> str:
        return json.loads(get(self.url + "/v1/models")[1])["data"][0]["id"]

    def metrics(self) -> str:
        return get(self.url + "/metrics")[1]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: vLLM shuts the engine core down itself
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start(entry: dict, cache_dir: str, log: Path, extra_env: dict[str, str] | None = None) -> Server:
    port = free_port()
    argv = stock_command(entry, cache_dir, port)[0]
    env = server_environ(entry, cache_dir, extra_env)
    out = open(log, "w")
    started = time.monotonic()
    # own process group: stop() signals the API server, which stops its engine core
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    out.close()
    return Server(proc, port, log, started)


def get(url: str, timeout: float = 30) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def post(url: str, body: dict, timeout: float = 600) -> tuple[int, dict]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def entry_dict(config: Path, name: str | None = None) -> dict:
    """A matrix entry as the runners receive it (its local model resolved)."""
    from aotc.matrix import load_matrix

    matrix = load_matrix(config)
    entry = matrix.entry(name) if name else matrix.entries[0]
    return {**entry.to_dict(), "model_path": str(entry.model_path) if entry.model_path else None}


def server_environ(entry: dict, cache_dir: str, extra_env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the stock server runs with (what the guard fingerprints)."""
    env = dict(os.environ)
    for key, value in {**stock_command(entry, cache_dir, 0)[1], **(extra_env or {})}.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def samples(metrics_text: str, name: str) -> dict[str, float]:
    """Prometheus text format -> {label string: value} for one metric name ("" when unlabelled)."""
    found = {}
    for line in metrics_text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head, value = line.rsplit(" ", 1)
            found[head[len(name):].strip("{}")] = float(value)
    return found
