"""A scriptable stand-in for an OpenAI-compatible chat endpoint on 127.0.0.1, for judge tests (broken judges too).

Answers POST `.../chat/completions` in OpenAI's documented `chat.completion` shape from a queue of scripted replies
(content, HTTP status, delay, headers, raw body), logs every request, and counts requests in flight.

    standin = OpenAIStandIn()
    standin.push(content='{"ok": true}')              # one 200 answer
    standin.push(status=500, times=3)                  # three 500s
    standin.push(content="{}", delay_s=0.5)            # a slow answer
    standin.push(content="{}", hold=event)             # no answer until the test sets `event` (a certain timeout)
    standin.responder = lambda req: '{"ok": true}'     # when the queue is empty (content str or Reply)
    JudgeClient(standin.root, "m", ...); standin.requests[-1].json["messages"]; standin.close()
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

NO_REPLY_STATUS = 409  # answered when nothing is scripted: a 4xx the client does not retry or downgrade on


@dataclass(frozen=True)
class Reply:
    """One scripted reply. `body` (raw text) overrides everything but status, delay and headers.

    `hold`: the reply is not sent until this event is set, so a client's timeout fires first whatever the machine's
    load (set it when the test ends, e.g. in a `finally`).
    """

    content: str | None = None
    status: int = 200
    delay_s: float = 0.0
    headers: Mapping[str, str] = field(default_factory=dict)
    body: str | None = None
    usage: Mapping[str, int] | None = None  # default: rough counts (characters / 4)
    finish_reason: str = "stop"
    error_message: str | None = None  # for non-200 replies without a body
    hold: threading.Event | None = None


@dataclass(frozen=True)
class RecordedRequest:
    """One request the stand-in received."""

    method: str
    path: str
    headers: dict[str, str]
    json: Any  # the parsed body, or None if it was not JSON
    received_at: float


Responder = Callable[[Any], "Reply | str"]


class OpenAIStandIn:
    """A threaded HTTP server speaking the OpenAI chat-completions response format from a script."""

    def __init__(self, *, model: str = "standin", api_key: str | None = None, responder: Responder | None = None):
        """Start serving on a free 127.0.0.1 port.

        Args:
            model: The `model` echoed in answers when the request names none.
            api_key: If set, requests without `Authorization: Bearer <api_key>` get 401 (OpenAI's error shape).
            responder: Called with the request JSON when the queue is empty; returns a Reply or a content string.
                Without one, an empty queue answers 409 "no scripted reply".
        """
        self.model = model
        self.api_key = api_key
        self.responder = responder
        self.requests: list[RecordedRequest] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._queue: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True  # a delayed reply must not block close()
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="openai-standin", daemon=True
        )  # a short poll interval makes close() quick
        self._thread.start()

    @property
    def root(self) -> str:
        """The server root URL (no /v1), e.g. http://127.0.0.1:54321."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def push(
        self,
        content: str | None = None,
        *,
        status: int = 200,
        delay_s: float = 0.0,
        headers: Mapping[str, str] | None = None,
        body: str | None = None,
        usage: Mapping[str, int] | None = None,
        finish_reason: str = "stop",
        error_message: str | None = None,
        hold: threading.Event | None = None,
        times: int = 1,
    ) -> None:
        """Queue a reply (`times` copies). Replies are consumed in order, one per chat-completions request."""
        reply = Reply(content, status, delay_s, dict(headers or {}), body, usage, finish_reason, error_message, hold)
        with self._lock:
            self._queue.extend([reply] * times)

    @property
    def pending(self) -> int:
        """Scripted replies not yet used."""
        with self._lock:
            return len(self._queue)

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        """The logged chat-completions requests only."""
        with self._lock:
            return [r for r in self.requests if r.path.endswith("/chat/completions")]

    def close(self) -> None:
        """Stop serving and free the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- request handling (runs on the server's threads) -----------------------------------------------------

    def _next_reply(self, request_json: Any) -> Reply:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
        if self.responder is not None:
            try:
                made = self.responder(request_json)
            # A broken test responder shows up as a 500 naming it, not as a dropped socket.
            except Exception as exc:  # noqa: BLE001
                return Reply(status=500, error_message=f"openai_standin responder raised {exc!r}")
            return Reply(content=made) if isinstance(made, str) else made
        return Reply(status=NO_REPLY_STATUS, error_message="openai_standin: no scripted reply left (push one)")

    def _completion_body(self, reply: Reply, request_json: Any) -> dict[str, Any]:
        req = request_json if isinstance(request_json, dict) else {}
        content = reply.content if reply.content is not None else ""
        prompt_chars = sum(len(str(m.get("content", ""))) for m in req.get("messages", []) if isinstance(m, dict))
        usage = dict(reply.usage) if reply.usage is not None else {
            "prompt_tokens": prompt_chars // 4 + 1,
            "completion_tokens": len(content) // 4 + 1,
        }  # fmt: skip
        usage.setdefault("total_tokens", usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0))
        return {
            "id": f"chatcmpl-standin-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(req.get("model") or self.model),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply.content},
                    "logprobs": None,
                    "finish_reason": reply.finish_reason,
                }
            ],
            "usage": usage,
        }

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
                return

            def _send(self, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> None:
                data = payload.encode("utf-8") if isinstance(payload, str) else json.dumps(payload).encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (e.g. its timeout fired during a delay)

            def _record(self, body: Any) -> None:
                rec = RecordedRequest(self.command, self.path, dict(self.headers.items()), body, time.time())
                with standin._lock:
                    standin.requests.append(rec)

            def do_GET(self) -> None:
                self._record(None)
                if self.path.rstrip("/").endswith("/models"):
                    model = {"id": standin.model, "object": "model", "created": 0, "owned_by": "standin"}
                    self._send(200, {"object": "list", "data": [model]})
                else:
                    self._send(404, _error("not found", "invalid_request_error"))

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                self._record(body)
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, _error(f"unknown path {self.path}", "invalid_request_error"))
                    return
                if standin.api_key is not None and self.headers.get("Authorization") != f"Bearer {standin.api_key}":
                    self._send(401, _error("Incorrect API key provided.", "invalid_request_error", "invalid_api_key"))
                    return
                with standin._lock:
                    standin.in_flight += 1
                    standin.max_in_flight = max(standin.max_in_flight, standin.in_flight)
                try:
                    reply = standin._next_reply(body)
                    if reply.delay_s > 0:
                        time.sleep(reply.delay_s)
                    if reply.hold is not None:
                        reply.hold.wait()
                finally:
                    # Leave the in-flight count BEFORE answering: once the client has the answer it may send its
                    # next request, which must not be counted as overlapping this one.
                    with standin._lock:
                        standin.in_flight -= 1
                if reply.body is not None:
                    self._send(reply.status, reply.body, reply.headers)
                elif reply.status != 200:
                    message = reply.error_message or f"stand-in scripted HTTP {reply.status}"
                    kind = "server_error" if reply.status >= 500 else "invalid_request_error"
                    self._send(reply.status, _error(message, kind), reply.headers)
                else:
                    self._send(200, standin._completion_body(reply, body), reply.headers)

        return Handler


def _error(message: str, kind: str, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error body shape."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}
