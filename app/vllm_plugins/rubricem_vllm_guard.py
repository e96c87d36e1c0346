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
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = frozenset({"/health"})  # liveness probes carry no key; it tells nothing but "up"


class PolicyServerGuard:
    """Pure ASGI middleware: 403 for any request with an Origin header, 401 without the bearer key (when one is set)
    on every path but /health. Keys are compared as SHA-256 digests in constant time."""

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
        elif self._key_digest is not None and path not in OPEN_PATHS and not self._authorized(headers):
            await _refuse(scope, send, 401, "Unauthorized")
        else:
            await self.app(scope, receive, send)

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        scheme, _, given = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or self._key_digest is None:
            return False
        return hmac.compare_digest(hashlib.sha256(given.strip().encode()).digest(), self._key_digest)


async def _refuse(scope: Scope, send: Send, status: int, message: str) -> None:
    if scope["type"] == "websocket":  # closing before accepting refuses the handshake
        await send({"type": "websocket.close", "code": 1008})
        return
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
                + ([(b"www-authenticate", b"Bearer")] if status == 401 else [])})
    await send({"type": "http.response.body", "body": body})
