"""Which store, and the fsspec options a CLI user can only give through the environment."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from aotc.errors import AotcError, BadInput

DEFAULT_STORE_DIR = ".aotc/store"
ENV_STORE = "AOTC_STORE"
ENV_STORE_OPTIONS = "AOTC_STORE_OPTIONS"  # JSON object of fsspec storage options
ENV_STORE_ENDPOINT = "AOTC_STORE_ENDPOINT"  # gs:// endpoint (an emulator); implies anonymous access
ENV_STORAGE_EMULATOR = "STORAGE_EMULATOR_HOST"
# getaddrinfo's answers that a name has no address: a fact about the name, unlike EAI_AGAIN (no answer yet)
NAME_HAS_NO_ADDRESS = frozenset({socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)})


def resolve_store_url(cli_url: str | None, config_store: str | None = None) -> str:
    """--store > $AOTC_STORE > the config's ``store:`` > ``.aotc/store`` under the cwd."""
    for candidate in (cli_url, os.environ.get(ENV_STORE), config_store):
        if candidate:
            return candidate
    return os.path.abspath(DEFAULT_STORE_DIR)


def protocol_of(url: str) -> str:
    return url.split("://", 1)[0] if "://" in url else "file"


def store_options_from_env(protocol: str) -> dict[str, Any]:
    """Storage options a CLI user (or a test) can only pass through the environment."""
    options: dict[str, Any] = {}
    raw = os.environ.get(ENV_STORE_OPTIONS)
    if raw:
        try:
            parsed = json.loads(raw)
        except ValueError as exc:
            raise BadInput(f"${ENV_STORE_OPTIONS} is not a JSON object: {exc}") from exc
        if not isinstance(parsed, dict):
            raise BadInput(f"${ENV_STORE_OPTIONS} must be a JSON object, got {type(parsed).__name__}")
        options.update(parsed)
    if protocol in ("gs", "gcs"):
        endpoint = os.environ.get(ENV_STORE_ENDPOINT) or os.environ.get(ENV_STORAGE_EMULATOR)
        if endpoint:
            options.setdefault("endpoint_url", endpoint)
            options.setdefault("token", "anon")  # an emulator has no auth; probing for it stalls
    return options


def require_resolvable_host(url: str, options: Mapping[str, Any]) -> None:
    """A gs:// store whose host name does not resolve here fails now, in one line (exit 2). That is a wrong
    endpoint or a machine without DNS for it, not a transient fault, yet gcsfs would first probe for
    credentials and then retry six times, ~50 s, before saying so. A resolver that did not answer
    (EAI_AGAIN) stays gcsfs's to retry; with ``session_kwargs`` (a proxy, a connector of its own) the
    connection is the caller's to make, and a name this machine cannot resolve may still be reachable."""
    if "session_kwargs" in options:
        return
    import gcsfs.core

    endpoint = options.get("endpoint_url") or gcsfs.core._location()  # where gcsfs itself would connect
    parts = urlsplit(endpoint if "//" in endpoint else f"//{endpoint}")
    if not parts.hostname:
        return
    try:
        socket.getaddrinfo(parts.hostname, parts.port or 443, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        if exc.errno in NAME_HAS_NO_ADDRESS:
            raise BadInput(f"store {url}: its host {parts.hostname} does not resolve on this machine "
                           f"({exc.strerror}): check ${ENV_STORE_ENDPOINT} / ${ENV_STORAGE_EMULATOR}, or this "
                           "machine's DNS") from None


# Transports fsspec's remote stores use; their errors mean the store did not answer, not what it answered
TRANSPORT_MODULES = frozenset({"aiohttp", "gcsfs", "google", "requests", "urllib3"})


def unreachable(exc: BaseException | None) -> bool:
    """The store could not be reached or did not answer (refused, reset, timed out, an HTTP error after the
    client's retries), as opposed to a verdict on what it holds (missing, damaged: aotc's own errors)."""
    if isinstance(exc, AotcError):
        return False
    while exc is not None:
        if isinstance(exc, (ConnectionError, TimeoutError)) or type(exc).__module__.split(".")[0] in TRANSPORT_MODULES:
            return True
        exc = exc.__cause__
    return False
