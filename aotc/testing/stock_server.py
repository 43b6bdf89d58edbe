"""Talking to a stock `vllm serve` started by aotc/server.py (the shared launcher): HTTP and log helpers
for the guard's server tests and the start-up bench."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

from aotc.matrix import Entry
from aotc.processes import free_port
from aotc.server import Server, serve_command


def start(entry: Entry, cache_dir: str | Path, log: Path, guard: str = "strict",
          extra_env: dict[str, str] | None = None) -> Server:
    """The entry's stock server with ``AOTC_GUARD=guard`` on a random free port, started."""
    command = serve_command(entry, cache_dir, free_port(), guard=guard)
    command.env.update(extra_env or {})
    return Server(command, log).start()


def server_environ(entry: Entry, cache_dir: str | Path, guard: str = "strict",
                   extra_env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that server runs with (what the guard fingerprints)."""
    command = serve_command(entry, cache_dir, 0, guard=guard)
    command.env.update(extra_env or {})
    return command.process_env()


def guard_lines(server: Server) -> list[str]:
    return [line for line in server.log_path.read_text(errors="replace").splitlines() if "aotc guard:" in line]


def complete(server: Server, prompt: list[int], **params) -> tuple[int, dict]:
    body = {"model": server.command.model, "prompt": prompt, "max_tokens": 4, **params}
    return post(server.command.url + "/v1/completions", body)


def metrics(server: Server) -> str:
    return get(server.command.url + "/metrics")[1]


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


def samples(metrics_text: str, name: str) -> dict[str, float]:
    """Prometheus text format -> {label string: value} for one metric name ("" when unlabelled)."""
    found = {}
    for line in metrics_text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head, value = line.rsplit(" ", 1)
            found[head[len(name):].strip("{}")] = float(value)
    return found
