"""The HTTP transport shared by the policy clients: one `httpx.AsyncClient`, retries with backoff and jitter, and
the mapping of HTTP failures to the typed errors of `agent.errors`."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from urllib.parse import urlsplit
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any, Self

import httpx

from agent.errors import (
    ContextTooLong,
    PolicyError,
    PolicyRateLimited,
    PolicyRequestError,
    PolicyTimeout,
    PolicyUnavailable,
)
from agent.retry import jittered_backoff, retry_after_seconds

if TYPE_CHECKING:
    from agent.config import AgentConfig
    from agent.protocols import Served

log = logging.getLogger("agent.policy")  # one logger for the whole client package, named as before the split

# Phrases servers use when the prompt does not fit (vLLM 400 messages, llama-cpp-python's "context_length_exceeded").
_CONTEXT_PATTERNS = re.compile(
    r"maximum context length|maximum model length|context window|context_length_exceeded|prompt is too long"
    r"|is longer than the maximum",
    re.IGNORECASE,
)


class HTTPPolicyBase:
    """Shared transport: one `httpx.AsyncClient`, retries with backoff and jitter, error mapping."""

    unreachable_hint = ""  # appended to "cannot reach the policy server": how to start the server this client needs

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        max_retries: int = 4,
        transport: httpx.AsyncBaseTransport | None = None,
        backoff_s: float = 0.5,
        backoff_max_s: float = 8.0,
    ) -> None:
        root = base_url.rstrip("/")
        if not root.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, not {base_url!r}")
        if root.endswith("/v1"):
            raise ValueError("base_url is the server root; drop the trailing /v1 (the client adds it)")
        if not model:
            raise ValueError("model (the served alias) must not be empty")
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self._model = model
        self._shown_root = _without_userinfo(root)  # for error messages: never a password in the URL
        self._closed = False
        self._max_retries = int(max_retries)
        self._backoff_s = float(backoff_s)
        self._backoff_max_s = float(backoff_max_s)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # The key lives only in this header; it is never logged or put in an error message.
        self._http = httpx.AsyncClient(
            base_url=root, timeout=httpx.Timeout(timeout_s), transport=transport, headers=headers
        )

    @property
    def policy_version(self) -> str:
        """The served alias sent as `model`; it names the policy version that answers the next request."""
        return self._model

    @property
    def model(self) -> str:
        """The served model/adapter alias."""
        return self._model

    @property
    def server_url(self) -> str:
        """The server root without credentials in the URL (safe in messages and logs)."""
        return self._shown_root

    def _alias(self, served: Served | None) -> str:
        """The name one request is sent as `model`: the session's pinned one, else the client's current alias.

        Why per request: several sessions share one client, and `set_model` is global; a session pinned to its own
        version (`Served`) must never be answered by another session's adapter.
        """
        return served.model if served is not None else self._model

    def set_model(self, alias: str) -> None:
        """Switch the served alias for later requests (a request in flight keeps the alias it started with)."""
        if not alias:
            raise ValueError("alias must not be empty")
        self._model = alias

    @classmethod
    def from_config(cls, config: AgentConfig, transport: httpx.AsyncBaseTransport | None = None) -> Self:
        """A client for the policy endpoint described by the agent settings."""
        key = config.policy_api_key.get_secret_value() if config.policy_api_key is not None else None
        if len(config.policy_urls) > 1:
            raise ValueError("several policy URLs are set: build an agent.policy.ReplicaSet for them, not one client")
        return cls(
            config.policy_urls[0],
            config.policy_model,
            api_key=key,
            timeout_s=config.policy_timeout_s,
            max_retries=config.policy_max_retries,
            transport=transport,
        )

    async def aclose(self) -> None:
        """Close the connection pool; later requests raise PolicyUnavailable. Idempotent."""
        self._closed = True
        await self._http.aclose()

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self._backoff_max_s)
        return jittered_backoff(attempt, self._backoff_s, self._backoff_max_s)

    async def _post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST JSON with retries on 429, 5xx, connection errors and timeouts; return the decoded JSON object."""
        return self._decode(path, await self._send("POST", path, body=body))

    async def _send(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
        retries: int | None = None,
        passthrough: Collection[int] = (),
    ) -> httpx.Response:
        """Send one request with retries on 429, 5xx, connection errors and timeouts; return the < 400 response.

        `retries` overrides the client's retry count (0 for requests that must not be repeated blindly); a status in
        `passthrough` is returned to the caller, which reads its body, instead of being mapped to an error.
        """
        if self._closed:
            raise PolicyUnavailable("the policy client is closed")
        max_retries = self._max_retries if retries is None else retries
        last: PolicyError | None = None
        for attempt in range(max_retries + 1):
            retry_after: float | None = None
            started = time.monotonic()
            try:
                resp = await self._http.request(method, path, json=body, params=params)
            except httpx.TimeoutException as exc:
                last = PolicyTimeout(f"{method} {path}: no answer within the timeout ({type(exc).__name__})")
            except httpx.TransportError as exc:
                last = PolicyUnavailable(
                    f"{method} {path}: cannot reach the policy server at {self._shown_root} "
                    f"({type(exc).__name__}: {exc}){self.unreachable_hint}"
                )
            else:
                status = resp.status_code
                log.debug("%s %s -> %d in %.2fs", method, path, status, time.monotonic() - started)
                if status < 400 or status in passthrough:
                    return resp
                message, code = error_details(resp)
                if status == 429:
                    last = PolicyRateLimited(f"{method} {path}: rate limited (429): {message}")
                    retry_after = retry_after_seconds(resp.headers.get("retry-after"))
                elif status >= 500:
                    last = PolicyUnavailable(f"{method} {path}: server error {status}: {message}")
                elif _CONTEXT_PATTERNS.search(message) or code == "context_length_exceeded":
                    raise ContextTooLong(f"{method} {path}: {message}")
                else:
                    raise PolicyRequestError(f"{method} {path}: {status}: {message}", status_code=status)
            if attempt < max_retries:
                delay = self._delay(attempt, retry_after)
                log.warning("policy request %s failed (%s); retry %d in %.2fs", path, last, attempt + 1, delay)
                await asyncio.sleep(delay)
        assert last is not None
        raise last

    @staticmethod
    def _decode(path: str, resp: httpx.Response) -> dict[str, Any]:
        try:
            data = resp.json()
        except ValueError as exc:
            raise PolicyUnavailable(
                f"POST {path}: the server answered {resp.status_code} with a non-JSON body"
            ) from exc
        if not isinstance(data, dict):
            raise PolicyUnavailable(f"POST {path}: expected a JSON object, got {type(data).__name__}")
        return data


def _without_userinfo(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{netloc}{f':{parts.port}' if parts.port else ''}{parts.path}"


def error_details(resp: httpx.Response) -> tuple[str, str | None]:
    """The error message and code from an OpenAI-style `{"error": {...}}`, FastAPI `{"detail": ...}` or plain body."""
    try:
        data = resp.json()
    except ValueError:
        return resp.text[:500] or resp.reason_phrase, None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):
            code = err.get("code")
            kind = err.get("type")
            message = str(err.get("message") or kind or err)
            return message[:2000], str(code) if isinstance(code, str) else (str(kind) if kind else None)
        if isinstance(err, str):
            return err[:2000], None
        if "detail" in data:
            return str(data["detail"])[:2000], None
    return str(data)[:2000], None
