"""A real headless browser for tests: Debian's Chromium, installed on first use, and the DOM it rendered.

``dump_dom`` returns what Chromium serializes after loading the page (``--dump-dom``), not the file on
disk; ``Dom`` turns that into elements with attributes and text for assertions.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
# no network, no first-run UI, nothing shared between runs (each run gets a fresh --user-data-dir)
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")
INSTALL_TIMEOUT = 900


def find_chromium() -> str | None:
    explicit = os.environ.get("AOTC_CHROMIUM")
    if explicit:
        return explicit
    return next((path for name in CANDIDATES if (path := shutil.which(name))), None)


def ensure_chromium() -> str:
    """Chromium's path; on a fresh Debian machine (CI runs ``make test`` as root) apt installs it first."""
    found = find_chromium()
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for command in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium"]):
            proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=INSTALL_TIMEOUT)
            if proc.returncode:
                raise RuntimeError(f"{' '.join(command)} failed: {proc.stderr.strip()[-500:]}")
    found = find_chromium()
    if not found:
        raise RuntimeError("no Chromium: install it (apt-get install chromium) or set AOTC_CHROMIUM")
    return found


def _run(chromium: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="aotc-chromium-") as profile:
        proc = subprocess.run([chromium, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if proc.returncode:
        raise RuntimeError(f"chromium exited {proc.returncode}: {proc.stderr.strip()[-1000:]}")
    return proc


@dataclass(frozen=True)
class Rendered:
    dom: str
    seconds: float  # wall time of the whole browser run: start-up, load, layout, serialization


def dump_dom(chromium: str, page: Path) -> Rendered:
    start = time.perf_counter()
    proc = _run(chromium, "--dump-dom", page.resolve().as_uri())
    return Rendered(proc.stdout, time.perf_counter() - start)


def screenshot(chromium: str, page: Path, png: Path, width: int = 1400, height: int = 2400) -> Path:
    _run(chromium, f"--window-size={width},{height}", f"--screenshot={png.resolve()}", page.resolve().as_uri())
    if not png.is_file() or png.stat().st_size == 0:
        raise RuntimeError(f"chromium wrote no screenshot at {png}")
    return png


# --- the rendered DOM -----------------------------------------------------------------------------

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclass
class Node:
    tag: str
    attrs: dict[str, str | None]
    parts: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return " ".join(" ".join(self.parts).split())  # adjacent cells read apart, like innerText


class Dom(HTMLParser):
    def __init__(self, markup: str):
        super().__init__(convert_charrefs=True)
        self.nodes: list[Node] = []
        self._open: list[Node] = []
        self.feed(markup)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, dict(attrs))
        self.nodes.append(node)
        if tag not in VOID:
            self._open.append(node)

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i].tag == tag:
                del self._open[i:]
                return

    def handle_data(self, data: str) -> None:
        for node in self._open:
            node.parts.append(data)

    def find(self, tag: str | None = None, **attrs: str | bool) -> list[Node]:
        """Elements by tag and attributes (``data_entry="x"`` matches data-entry="x"; True: present)."""
        wanted = {k.rstrip("_").replace("_", "-"): v for k, v in attrs.items()}
        return [n for n in self.nodes if (tag is None or n.tag == tag) and all(
            (k in n.attrs) if v is True else n.attrs.get(k) == v for k, v in wanted.items())]

    def one(self, tag: str | None = None, **attrs: str | bool) -> Node:
        found = self.find(tag, **attrs)
        assert len(found) == 1, f"expected one <{tag or '*'} {attrs}>, found {len(found)}"
        return found[0]
