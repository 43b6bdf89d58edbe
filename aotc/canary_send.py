"""The request kinds (aotc/canary_requests.py) sent to the running server, and how it answered each: served,
refused by the stack (HTTP 400: its limitation, not a failure) or failed; a stream is read to its end."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from aotc.canary_requests import Planned


@dataclass
class KindOutcome:
    sent: int = 0
    ok: int = 0
    rejected: int = 0
    """Requests the stack refused (HTTP 400): its limitation, neither served nor failed."""
    rejected_by_stack: str | None = None
    """The stack's message for the first refusal."""
    failed: int = 0
    not_sent: str | None = None
    """Why the kind was not sent to this entry's server."""
    errors: list[str] = field(default_factory=list)

    def count(self, answer: Answer) -> None:
        self.sent += 1
        if answer.status == "ok":
            self.ok += 1
        elif answer.status == "rejected":
            self.rejected += 1
            self.rejected_by_stack = self.rejected_by_stack or answer.message
        else:
            self.failed += 1
            self.errors = sorted({*self.errors, answer.message})[:3]

    def add(self, other: KindOutcome) -> None:
        self.sent, self.ok, self.failed = self.sent + other.sent, self.ok + other.ok, self.failed + other.failed
        self.rejected += other.rejected
        self.rejected_by_stack = self.rejected_by_stack or other.rejected_by_stack
        self.errors = sorted({*self.errors, *other.errors})[:3]


def send_kinds(url: str, planned: list[Planned], models: tuple[str, ...],
               timeout: float = 300) -> dict[str, KindOutcome]:
    """Every kind at once, each kind's bodies at once (a ``first_alone`` kind's first body ahead of the rest).
    A body that names no model names ``models[i % len(models)]``, i counting over all kinds' bodies, so base
    model and adapters mix across kinds."""
    bodies_by_kind, i = [], 0
    for p in planned:
        bodies = []
        for body in p.bodies:
            bodies.append({"model": models[i % len(models)], **body})
            i += 1
        bodies_by_kind.append(bodies)
    structured = threading.Lock()
    with concurrent.futures.ThreadPoolExecutor(max(1, len(planned))) as pool:
        outcomes = list(pool.map(lambda p, bodies: send_kind(url, p, bodies, timeout, structured), planned,
                                 bodies_by_kind))
    return {p.kind.name: outcome for p, outcome in zip(planned, outcomes)}


def send_kind(url: str, planned: Planned, bodies: list[dict[str, Any]], timeout: float,
              structured: threading.Lock) -> KindOutcome:
    outcome = KindOutcome(not_sent=planned.not_sent)
    waves = [bodies[:1], bodies[1:]] if planned.kind.first_alone else [bodies]
    serial = structured if planned.kind.one_structured_at_a_time else contextlib.nullcontext()

    def one(body: dict[str, Any]) -> Answer:
        with serial:
            return send(url + planned.kind.endpoint, body, timeout)

    for wave in filter(None, waves):
        with concurrent.futures.ThreadPoolExecutor(len(wave)) as pool:
            for answer in pool.map(one, wave):
                outcome.count(answer)
    return outcome


@dataclass(frozen=True)
class Answer:
    status: str
    """ok | rejected (HTTP 400: the stack refused the request) | failed"""
    message: str = ""


def send(url: str, body: dict[str, Any], timeout: float) -> Answer:
    """One request, read to its end (a stream to its ``[DONE]``)."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            text = response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        message = error_message(exc.read())
        return Answer("rejected", message) if exc.code == 400 else Answer("failed", f"HTTP {exc.code}: {message}")
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        return Answer("failed", f"request failed: {exc}")
    problem = stream_problem(text) if body.get("stream") else answer_problem(text)
    return Answer("failed", problem) if problem else Answer("ok")


def error_message(raw: bytes) -> str:
    """vLLM's error text: ``{"error": {"message": ...}}`` or ``{"message": ...}``; else the raw start."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return raw[:300].decode(errors="replace")
    if not isinstance(doc, dict):
        return str(doc)[:300]
    error = doc.get("error")
    return str((error.get("message") if isinstance(error, dict) else None) or doc.get("message") or doc)[:300]


def answer_problem(text: str) -> str | None:
    try:
        doc = json.loads(text)
    except ValueError:
        return f"not JSON: {text[:200]}"
    return None if isinstance(doc, dict) and doc.get("choices") else f"no choices: {text[:200]}"


def stream_problem(text: str) -> str | None:
    """An error event, or a stream that ended without ``data: [DONE]``."""
    events = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
    for event in events:
        if event != "[DONE]" and ('"error"' in event and '"choices"' not in event):
            return f"error event: {error_message(event.encode())}"
    return None if events and events[-1] == "[DONE]" else f"stream ended without [DONE]: {text[-200:]}"
