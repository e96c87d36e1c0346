"""The gate in front of every route of the vLLM server `rubricem policy-server` starts (issue 46).

vLLM loads this module itself (`--middleware rubricem_vllm_guard.PolicyServerGuard`, found through the PYTHONPATH
the launcher gives the server), so it runs in vLLM's own interpreter and imports nothing but the standard library.

Why it exists: vLLM 0.32's `--api-key` checks only paths under /v1, /v2, /inference and /cohere
(vllm/entrypoints/serve/middleware/authenticate.py, GUARDED_PREFIX). The same server also answers /invocations
(SageMaker's inference route), POST /adapters and DELETE /adapters/{name} (SageMaker's LoRA load and unload,
registered by model_hosting_container_standards), /tokenize, /detokenize, /metrics and more, all without the key.
So, with a key (`VLLM_API_KEY`, which the launcher sets), every path but /health needs it: a route vLLM adds in a
later version is closed until someone opens it here.

And whatever the key: a request that carries an `Origin` header is refused. Browsers send one with every POST, so a
web page (cross-site, or through a DNS name rebound to this address) cannot load adapters or sample; no client of
the policy server is a browser.

Without a key (the launcher allows that only on a loopback bind: 127.0.0.1, localhost or ::1), the Host header must
name a loopback host too: `localhost`, a 127.x address or ::1, at any port (issue 65, finding 14). A browser's GET
sends no Origin, so a web page whose DNS name an attacker rebinds to 127.0.0.1 could otherwise read /v1/models and
/metrics; its requests carry that name as Host and get 421. The configured host is always one of those names then.
With a key, the key is the lock and the Host is not checked (behind a proxy it is a name this module cannot know).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = frozenset({"/health"})  # liveness probes carry no key; it tells nothing but "up"
LOOPBACK_NAMES = frozenset({"localhost"})  # and every loopback address (127.0.0.0/8, ::1)
WRONG_HOST = ("this policy server has no key and answers only requests addressed to a loopback host (localhost, "
              "127.0.0.1 or [::1]); set RUBRICEM_AGENT__POLICY_API_KEY to serve other names")


class PolicyServerGuard:
    """Pure ASGI middleware: 403 for any request with an Origin header, 401 without the bearer key (when one is set)
    on every path but /health, and with no key set, 421 for a Host header that is not a loopback host. Keys are
    compared as SHA-256 digests in constant time."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        key = os.environ.get("VLLM_API_KEY", "")
        self._key_digest = hashlib.sha256(key.encode()).digest() if key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan
            await self.app(scope, receive, send)
            return
        headers = {name.lower(): value for name, value in scope.get("headers", [])}
        path = scope["path"].removeprefix(scope.get("root_path", "") or "")
        if b"origin" in headers:
            await _refuse(scope, send, 403, "requests from web pages are refused")
        elif self._key_digest is None and not is_loopback_host(headers.get(b"host", b"").decode("latin-1")):
            await _refuse(scope, send, 421, WRONG_HOST)
        elif self._key_digest is not None and path not in OPEN_PATHS and not self._authorized(headers):
            await _refuse(scope, send, 401, "Unauthorized")
        else:
            await self.app(scope, receive, send)

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        scheme, _, given = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or self._key_digest is None:
            return False
        return hmac.compare_digest(hashlib.sha256(given.strip().encode()).digest(), self._key_digest)


def is_loopback_host(host: str) -> bool:
    """Whether a Host header names this machine's loopback interface: `localhost`, a 127.x address or ::1 (bracketed),
    with or without a port. An empty or malformed header is not (HTTP/1.1 clients always send one)."""
    name = host.strip().lower()
    if name.startswith("["):  # [v6] or [v6]:port
        name, bracket, rest = name[1:].partition("]")
        if not bracket or (rest and not _is_port(rest)):
            return False
    elif name.count(":") == 1:
        name, _, port = name.partition(":")
        if not _is_port(":" + port):
            return False
    elif ":" in name:  # a bare IPv6 address is not a valid Host header
        return False
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _is_port(text: str) -> bool:
    """`:` and one to five digits."""
    return text.startswith(":") and 1 <= len(text) - 1 <= 5 and text[1:].isdigit()


async def _refuse(scope: Scope, send: Send, status: int, message: str) -> None:
    if scope["type"] == "websocket":  # closing before accepting refuses the handshake
        await send({"type": "websocket.close", "code": 1008})
        return
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
                + ([(b"www-authenticate", b"Bearer")] if status == 401 else [])})
    await send({"type": "http.response.body", "body": body})
