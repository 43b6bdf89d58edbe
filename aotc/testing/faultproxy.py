"""A loopback HTTP proxy between gcsfs and fake-gcs-server that adds latency and injects faults.

Faults (each rule hits ``times`` matching requests, every ``every``-th one, per distinct path when
``per_path``; a request matches when ``match`` is in its path and query, and ``body``, when set, in its body):
  pass           forward unchanged (``injected["pass"]`` counts the requests the rule matched)
  503            answer 503 without forwarding
  reset          drop the connection before forwarding
  drop_response  forward (the server acts on it), then drop the connection: a reply lost in transit
  truncate       forward, answer 200 with half the body and a Content-Length that says so
  reset_mid      forward, send half the body, then drop the connection
  stall          hold the request without answering until the proxy stops (a hung store)
  flip           forward, then flip the lowest bit of the body byte right after the first ``arg``
                 (the middle byte when ``arg`` is absent)
  flip_request   the same on the request body, before forwarding: an upload the server stores corrupt

In-process (tests): ``FaultProxy(upstream).start()`` runs it on a thread. As a process (the benchmark,
so it does not share the client's GIL): ``python -m aotc.testing.faultproxy --upstream URL --latency 0.03``
prints ``READY <port>``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import threading
from collections import Counter
from dataclasses import dataclass

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade",
               "proxy-connection", "te", "trailer"}


@dataclass
class Rule:
    kind: str
    match: str = ""  # regex searched in the request path and query
    method: str | None = None
    times: int = 1
    per_path: bool = False
    every: int = 1
    arg: str = ""
    body: str = ""  # regex searched in the request body (e.g. an upload's object name)


class FaultProxy:
    def __init__(self, upstream: str, latency: float = 0.0, port: int = 0):
        self.upstream = upstream.rstrip("/")
        self.latency, self.port = latency, port
        self.rules: list[Rule] = []
        self.injected: Counter[str] = Counter()
        self.requests = 0
        self._hits: Counter[tuple[int, str]] = Counter()
        self._seen: Counter[tuple[int, str]] = Counter()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add(self, kind: str, match: str = "", method: str | None = None, times: int = 1,
            per_path: bool = False, every: int = 1, arg: str = "", body: str = "") -> None:
        with self._lock:
            self.rules.append(Rule(kind, match, method, times, per_path, every, arg, body))

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()
            self._hits.clear()
            self._seen.clear()
            self.injected.clear()

    def _pick(self, method: str, path_qs: str, body: bytes) -> Rule | None:
        with self._lock:
            self.requests += 1
            for i, rule in enumerate(self.rules):
                if not re.search(rule.match, path_qs) or (rule.method and rule.method != method):
                    continue
                if rule.body and not re.search(rule.body.encode(), body):
                    continue
                key = (i, path_qs.split("?")[0] if rule.per_path else "")
                self._seen[key] += 1
                if self._hits[key] < rule.times and self._seen[key] % rule.every == 0:
                    self._hits[key] += 1
                    self.injected[rule.kind] += 1
                    return rule
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._forward(request)
        except ConnectionResetError:  # the client gave up on a request we were still relaying
            return web.Response(status=599)

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        if self.latency:
            await asyncio.sleep(self.latency)
        body = await request.read()
        rule = self._pick(request.method, request.path_qs, body)
        fault = rule.kind if rule else None
        if fault == "flip_request":
            body = flip_bit(body, rule.arg.encode())
        if fault == "stall":
            await self._stop.wait()
            return self._drop(request)
        if fault == "503":
            return web.json_response({"error": {"code": 503, "message": "injected"}}, status=503)
        if fault == "reset":
            return self._drop(request)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        async with self._session.request(request.method, self.upstream + request.path_qs, headers=headers,
                                         data=body or None, allow_redirects=False) as up:
            if fault == "drop_response":
                await up.read()
                return self._drop(request)
            if fault == "flip":
                return await self._flipped(up, rule.arg.encode())
            return await self._relay(request, up, fault)

    @staticmethod
    async def _flipped(up, after: bytes) -> web.Response:
        headers = {k: v for k, v in up.headers.items() if k.lower() not in HOP_HEADERS}
        return web.Response(status=up.status, body=flip_bit(await up.read(), after), headers=headers)

    async def _relay(self, request: web.Request, up, fault: str | None) -> web.StreamResponse:
        headers = {k: v for k, v in up.headers.items() if k.lower() not in HOP_HEADERS}
        if "Location" in headers:  # resumable-upload URLs must come back through us
            headers["Location"] = headers["Location"].replace(self.upstream, self.url)
        length = up.content_length
        limit = length // 2 if fault in ("truncate", "reset_mid") and length else None
        response = web.StreamResponse(status=up.status, headers=headers)
        if length is not None:
            response.content_length = limit if fault == "truncate" else length
        await response.prepare(request)
        sent = 0
        async for chunk in up.content.iter_chunked(1 << 20):
            if limit is not None and sent + len(chunk) >= limit:
                await response.write(chunk[: limit - sent])
                if fault == "reset_mid":
                    return self._drop(request)
                break
            await response.write(chunk)
            sent += len(chunk)
        await response.write_eof()
        return response

    @staticmethod
    def _drop(request: web.Request) -> web.StreamResponse:
        if request.transport is not None:
            request.transport.abort()
        return web.Response(status=599)  # never reaches the client

    async def serve(self) -> None:
        self._stop = asyncio.Event()
        self._session = ClientSession(connector=TCPConnector(limit=256), auto_decompress=False,
                                      timeout=ClientTimeout(total=None))
        app = web.Application(client_max_size=1 << 31)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()
            await self._session.close()

    def start(self) -> FaultProxy:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self.serve(),),
                                        name="faultproxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fault proxy did not start")
        return self

    def stop(self) -> None:
        if self._loop and self._stop:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread:
            self._thread.join(10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def flip_bit(body: bytes, after: bytes) -> bytes:
    """``body`` with the lowest bit of one byte flipped: the byte right after the first ``after``, or
    the middle byte when ``after`` is empty or absent."""
    flipped = bytearray(body)
    at = flipped.find(after) + len(after) if after and after in flipped else len(flipped) // 2
    flipped[at] ^= 1
    return bytes(flipped)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    proxy = FaultProxy(args.upstream, args.latency, args.port)

    async def run() -> None:
        task = asyncio.create_task(proxy.serve())
        while not proxy._ready.is_set():
            await asyncio.sleep(0.01)
        print(f"READY {proxy.port}", flush=True)
        await task

    asyncio.run(run())


if __name__ == "__main__":
    main()
