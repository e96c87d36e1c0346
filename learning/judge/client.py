"""JSON judge client for any OpenAI-compatible chat endpoint (vLLM, llama.cpp, OpenAI, Gemini's OpenAI API).

Asks for JSON of a schema, parses strictly, validates, repairs once; bounded concurrency, backoff on 429/5xx/timeouts,
an on-disk answer cache and token/cost accounting. Implements `learning.judge.types.JsonJudge`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Self

import httpx

from agent import telemetry
from agent.retry import jittered_backoff, retry_after_seconds
from learning.config import JudgeConfig
from learning.errors import JudgeError, JudgeOutputInvalid, JudgeRequestError, JudgeUnavailable
from learning.judge.cache import CachedAnswer, JudgeCache, cache_key, canonical_json
from learning.judge.types import JudgeCall, Usage

logger = logging.getLogger(__name__)

JsonMode = Literal["json_schema", "json_object", "prompt"]
JSON_MODES: tuple[JsonMode, ...] = ("json_schema", "json_object", "prompt")  # also the downgrade order

RETRY_AFTER_CAP_S = 60.0  # a server asking for a longer pause than this is treated as asking for this
RETRYABLE_STATUSES = frozenset({408, 425, 429})  # plus every 5xx
REPAIR_ANSWER_CHARS = 4000  # how much of a bad answer is quoted back in the repair turn
ERROR_SNIPPET_CHARS = 300
_JSON_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)
_MAX_BRACE_TRIES = 200  # bound the prose-extraction scan on long garbage


def chat_completions_url(base_url: str) -> str:
    """The chat-completions URL of an endpoint given as a server root or as an OpenAI-style API base.

    Rules: a URL already ending in `/chat/completions` is used as is; one ending in `/v1` or containing `/openai`
    (OpenAI's `https://api.openai.com/v1`, Gemini's `https://generativelanguage.googleapis.com/v1beta/openai`) gets
    `/chat/completions`; anything else is a server root (`http://127.0.0.1:8002`) and gets `/v1/chat/completions`.
    """
    root = base_url.strip().rstrip("/")
    if root.endswith("/chat/completions"):
        return root
    if root.endswith("/v1") or "/openai" in root:
        return root + "/chat/completions"
    return root + "/v1/chat/completions"


def _reject_constant(token: str) -> Any:
    raise ValueError(f"{token} is not valid JSON")


def _loads_strict(text: str) -> Any:
    # NaN/Infinity are Python extensions, not JSON: a judge emitting them gets the repair turn.
    return json.loads(text, parse_constant=_reject_constant)


def extract_json(content: str) -> Any:
    """Parse a judge answer as JSON.

    Strict first (`json.loads` of the whole answer). Tolerated, in this order: a fenced ```json block; otherwise
    leading/trailing prose around an object, by decoding the first `{` position that starts a complete JSON object.

    Raises:
        ValueError: with a short reason, when no JSON can be recovered.
    """
    text = content.strip()
    if not text:
        raise ValueError("the answer was empty")
    try:
        return _loads_strict(text)
    except ValueError as exc:
        first_error = exc
    fence = _JSON_FENCE.search(text)
    if fence is not None:
        try:
            return _loads_strict(fence.group(1).strip())
        except ValueError:
            pass
    decoder = json.JSONDecoder(parse_constant=_reject_constant)
    start = text.find("{")
    tries = 0
    while start != -1 and tries < _MAX_BRACE_TRIES:
        tries += 1
        try:
            obj, _end = decoder.raw_decode(text, start)
        except ValueError:
            start = text.find("{", start + 1)
            continue
        if isinstance(obj, dict):
            return obj
        start = text.find("{", start + 1)
    if isinstance(first_error, json.JSONDecodeError):
        reason = f"{first_error.msg} at char {first_error.pos}"
    else:
        reason = str(first_error)
    raise ValueError(f"not valid JSON ({reason})") from None


def check_schema_shape(data: Any, schema: Mapping[str, Any]) -> None:
    """A minimal structural check against the schema: top-level type and required keys (no full JSON Schema).

    Raises:
        ValueError: when the top level is not the schema's type or a required key is missing.
    """
    expected = schema.get("type")
    if expected == "object" and not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    if expected == "array" and not isinstance(data, list):
        raise ValueError(f"expected a JSON array, got {type(data).__name__}")
    if isinstance(data, dict):
        missing = [k for k in schema.get("required", ()) if k not in data]
        if missing:
            raise ValueError(f"missing required keys: {', '.join(map(str, missing))}")


@dataclass(frozen=True)
class _Answer:
    """One answered request: the message content and what it cost."""

    content: str
    finish_reason: str | None
    usage: Usage


class _FormatRejected(Exception):
    """The endpoint refused the request's response_format (internal: triggers the mode downgrade)."""


class _InvalidOutput(Exception):
    """The answer did not parse or validate (internal: triggers the repair retry)."""


class JudgeClient:
    """Structured-JSON judge over an OpenAI-compatible `/v1/chat/completions` endpoint.

    JSON modes (`json_mode`):
      - "json_schema": `response_format={"type": "json_schema", "json_schema": {"name", "schema", "strict": true}}`
        (vLLM, OpenAI, Gemini, the C++ llama-server);
      - "json_object": `{"type": "json_object", "schema": schema}`; llama-cpp-python turns the `schema` key into a
        grammar (constrained decoding), others ignore it; the schema is also described in the system message;
      - "prompt": no response_format; the schema is described in the system message only.
    Every mode parses strictly (see `extract_json`), applies `validate`, and on failure makes ONE repair request.

    Downgrade: if the endpoint refuses the response_format (HTTP 400/422, or any error whose body names
    `response_format`/`json_schema`, as llama-cpp-python's 500 does for json_schema), the same call is re-sent with
    the next mode (json_schema -> json_object -> prompt). The first mode that is accepted is remembered for the rest
    of this client's life (`effective_json_mode`). If every mode is refused, JudgeRequestError is raised and nothing
    is remembered (the 400 was then about something else, e.g. a too-long prompt).

    One client belongs to one event loop at a time; used from a new loop it opens a new connection pool.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        json_mode: JsonMode = "json_schema",
        concurrency: int = 4,
        timeout_s: float = 120.0,
        max_retries: int = 5,
        max_tokens: int = 2048,
        cache_dir: Path | None = None,
        price_input_per_mtok: float = 0.0,
        price_output_per_mtok: float = 0.0,
        transport: httpx.AsyncBaseTransport | None = None,
        backoff_s: float = 0.5,
        backoff_max_s: float = 8.0,
    ) -> None:
        """Configure the client; nothing is sent until the first call.

        Args:
            base_url: Server root or OpenAI-style API base (see `chat_completions_url`).
            model: Model name sent as `model`.
            api_key: Bearer token; never logged or put in an error message.
            json_mode: How JSON is requested (class docstring).
            concurrency: Requests in flight at once (per client).
            timeout_s: Limit of one HTTP request, seconds.
            max_retries: Retries of one request on 429/5xx/timeouts/connection errors.
            max_tokens: Default completion budget of a call.
            cache_dir: Folder of the answer cache; None = no cache.
            price_input_per_mtok: USD per million prompt tokens.
            price_output_per_mtok: USD per million completion tokens.
            transport: httpx transport to use (e.g. with proxies or custom TLS); None = httpx's default.
            backoff_s: First retry pause, doubled per retry, with jitter.
            backoff_max_s: Longest computed retry pause (a Retry-After header may ask for more, up to 60 s).
        """
        if json_mode not in JSON_MODES:
            raise ValueError(f"json_mode must be one of {JSON_MODES}, got {json_mode!r}")
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if timeout_s <= 0 or max_tokens < 1:
            raise ValueError("timeout_s must be > 0 and max_tokens >= 1")
        self.base_url = base_url
        self.url = chat_completions_url(base_url)
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"judge base_url must start with http:// or https://, got {base_url!r}")
        self.model = model
        self.json_mode: JsonMode = json_mode
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.max_tokens = max_tokens
        self.price_input_per_mtok = price_input_per_mtok
        self.price_output_per_mtok = price_output_per_mtok
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self._api_key = api_key or None
        self._transport = transport
        self._cache = JudgeCache(cache_dir) if cache_dir is not None else None
        self._mode: JsonMode = json_mode
        self._token_field = "max_tokens"  # switched to max_completion_tokens if the endpoint insists
        self._usage = Usage()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._http: httpx.AsyncClient | None = None
        self._sem: asyncio.Semaphore | None = None

    @classmethod
    def from_config(cls, cfg: JudgeConfig, cache_dir: Path | None) -> JudgeClient:
        """A client from the judge settings; `cache_dir` is used only when `cfg.cache` is on.

        Raises:
            ValueError: when no `base_url` is configured (that means the offline judge).
        """
        if not cfg.base_url:
            raise ValueError("no judge base_url is configured (the offline judge is used then)")
        return cls(
            cfg.base_url,
            cfg.model,
            api_key=cfg.api_key.get_secret_value() if cfg.api_key is not None else None,
            json_mode=cfg.json_mode,
            concurrency=cfg.concurrency,
            timeout_s=cfg.timeout_s,
            max_retries=cfg.max_retries,
            max_tokens=cfg.max_tokens,
            cache_dir=cache_dir if cfg.cache else None,
            price_input_per_mtok=cfg.price_input_per_mtok,
            price_output_per_mtok=cfg.price_output_per_mtok,
        )

    def __repr__(self) -> str:
        return f"JudgeClient(url={self.url!r}, model={self.model!r}, json_mode={self._mode!r})"

    @property
    def usage(self) -> Usage:
        """Running totals over this client's life: answered requests (a repaired call counts 2), cache hits,
        tokens and cost. Requests whose answers were invalid are counted too: they were billed."""
        return self._usage

    @property
    def effective_json_mode(self) -> JsonMode:
        """The JSON mode in use now (lower than `json_mode` after a downgrade)."""
        return self._mode

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool (the client can still be used afterwards: it opens a new one)."""
        http, loop = self._http, self._loop
        self._http, self._sem, self._loop = None, None, None
        if http is not None and loop is asyncio.get_running_loop():
            await http.aclose()

    async def complete_json(
        self,
        messages: Sequence[Mapping[str, str]],
        schema: Mapping[str, Any],
        *,
        name: str,
        validate: Callable[[Any], Any] | None = None,
        max_tokens: int | None = None,
        temperature: float = 0.0,
    ) -> JudgeCall:
        """Ask for JSON matching `schema`, parse strictly, validate; one repair request on invalid output.

        Args:
            messages: Chat messages (`role`, `content`).
            schema: JSON Schema of the answer (for OpenAI's strict mode: `additionalProperties: false` and every
                property required).
            name: Schema name (`[a-zA-Z0-9_-]`, as OpenAI requires); also part of the cache key.
            validate: Called with the parsed JSON; raises on a wrong shape. Its return value, if not None, becomes
                `JudgeCall.data` (e.g. `Model.model_validate` gives the model); else the parsed JSON is the data.
            max_tokens: Completion budget of this call (default: the client's).
            temperature: Sampling temperature.

        Returns:
            The parsed (and validated) answer; `cached=True` when served from the cache, `repaired=True` when the
            repair request fixed it.

        Raises:
            JudgeOutputInvalid: the answer and the repaired answer were both invalid.
            JudgeUnavailable: 429/5xx/timeouts/connection errors outlasted the retries.
            JudgeRequestError: the endpoint rejected the request (other 4xx).

        Each call is one "chat" span (issue 36) with the tokens billed (both requests when repaired), whether the
        cache answered, the finish reasons and, on failure, the reason: invalid, rejected or unavailable.
        """
        with telemetry.judge_call(name, model=self.model) as traced:
            try:
                call = await self._complete_json(messages, schema, name=name, validate=validate,
                                                 max_tokens=max_tokens, temperature=temperature, traced=traced)
            except JudgeError as exc:
                if exc.usage is not None:
                    traced.usage(prompt_tokens=exc.usage.prompt_tokens, completion_tokens=exc.usage.completion_tokens)
                traced.failed(_failure_reason(exc))
                raise
            traced.usage(prompt_tokens=call.usage.prompt_tokens, completion_tokens=call.usage.completion_tokens,
                         cached=call.cached)
            if call.repaired:
                traced.repaired()
            return call

    async def _complete_json(
        self,
        messages: Sequence[Mapping[str, str]],
        schema: Mapping[str, Any],
        *,
        name: str,
        validate: Callable[[Any], Any] | None,
        max_tokens: int | None,
        temperature: float,
        traced: telemetry.JudgeCall,
    ) -> JudgeCall:
        budget = int(max_tokens if max_tokens is not None else self.max_tokens)
        key = None
        generation: str | None = None  # the cache's, before the request: a clear meanwhile drops the write
        if self._cache is not None:
            key = cache_key(
                model=self.model,
                json_mode=self.json_mode,
                name=name,
                messages=messages,
                schema=schema,
                temperature=temperature,
                max_tokens=budget,
            )
            hit = self._cache_lookup(key, schema, validate)
            if hit is not None:
                return hit
            generation = self._cache.generation()

        conversation = [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]
        first = await self._request(conversation, schema, name, budget, temperature)
        traced.finish_reasons([first.finish_reason or "unknown"])
        spent = first.usage
        try:
            data = self._parse(first, schema, validate)
            self._cache_store(key, name, first, generation)
            return JudgeCall(data=data, model=self.model, usage=spent)
        except _InvalidOutput as exc:
            first_error = str(exc)
        logger.info("judge answer for %r invalid (%s); sending the repair request", name, first_error)

        repair = [
            *conversation,
            {"role": "assistant", "content": first.content[:REPAIR_ANSWER_CHARS]},
            {"role": "user", "content": self._repair_message(first_error, name, schema)},
        ]
        try:
            second = await self._request(repair, schema, name, budget, temperature)
        except JudgeError as exc:
            exc.usage = spent + (exc.usage or Usage())  # the invalid first answer was billed
            raise
        spent = spent + second.usage
        traced.finish_reasons([first.finish_reason or "unknown", second.finish_reason or "unknown"])
        try:
            data = self._parse(second, schema, validate)
        except _InvalidOutput as exc:
            raise JudgeOutputInvalid(
                self._redact(f"judge output for {name!r} invalid after one repair retry: {exc}"), usage=spent
            ) from None
        self._cache_store(key, name, second, generation)
        return JudgeCall(data=data, model=self.model, repaired=True, usage=spent)

    # --- parsing and the cache -------------------------------------------------------------------------------

    def _parse(self, answer: _Answer, schema: Mapping[str, Any], validate: Callable[[Any], Any] | None) -> Any:
        try:
            data = extract_json(answer.content)
            check_schema_shape(data, schema)
        except ValueError as exc:
            reason = str(exc)
            if answer.finish_reason == "length":
                reason += "; the answer was cut off at the token limit, so answer more briefly"
            raise _InvalidOutput(reason) from None
        if validate is None:
            return data
        try:
            result = validate(data)
        except Exception as exc:  # noqa: BLE001 - any exception from a caller's validator means "wrong shape"
            raise _InvalidOutput(_short(f"wrong shape: {exc}", 1000)) from None
        return data if result is None else result

    def _cache_lookup(
        self, key: str, schema: Mapping[str, Any], validate: Callable[[Any], Any] | None
    ) -> JudgeCall | None:
        assert self._cache is not None
        entry = self._cache.get(key)
        if entry is None:
            return None
        try:
            data = self._parse(_Answer(entry.content, "stop", Usage()), schema, validate)
        except _InvalidOutput:
            # The validator may have changed since the entry was written: a stale entry is just a miss.
            return None
        hit = Usage(cached_calls=1)
        self._usage = self._usage + hit
        return JudgeCall(data=data, model=self.model, cached=True, usage=hit)

    def _cache_store(self, key: str | None, name: str, answer: _Answer, generation: str | None) -> None:
        """Cache a valid answer, unless the cache was cleared (a deletion) since `generation` was read."""
        if key is None or self._cache is None:
            return
        self._cache.put(
            key,
            CachedAnswer(
                model=self.model,
                name=name,
                content=answer.content,
                prompt_tokens=answer.usage.prompt_tokens,
                completion_tokens=answer.usage.completion_tokens,
            ),
            generation=generation,
        )

    @staticmethod
    def _schema_instruction(name: str, schema: Mapping[str, Any]) -> str:
        return (
            "Answer with only one JSON object: no prose before or after it and no code fence. "
            f"It must match this JSON Schema (named {name}):\n{canonical_json(schema)}"
        )

    @staticmethod
    def _repair_message(error: str, name: str, schema: Mapping[str, Any]) -> str:
        return (
            f"Your previous answer could not be used: {error}. Reply again with only one JSON object that matches "
            f"the JSON Schema named {name} below, with no prose and no code fence.\n{canonical_json(schema)}"
        )

    # --- the HTTP request, its mode ladder and retries -------------------------------------------------------

    def _payload(
        self, mode: JsonMode, conversation: list[dict[str, str]], schema: Mapping[str, Any], name: str,
        budget: int, temperature: float,
    ) -> dict[str, Any]:  # fmt: skip
        messages = [dict(m) for m in conversation]
        if mode != "json_schema":
            # Put the schema in the (first) system message: some chat templates allow only one system turn.
            line = self._schema_instruction(name, schema)
            if messages and messages[0]["role"] == "system":
                messages[0]["content"] = f"{messages[0]['content']}\n\n{line}"
            else:
                messages.insert(0, {"role": "system", "content": line})
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            self._token_field: budget,
            "temperature": temperature,
        }
        if mode == "json_schema":
            payload["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": name, "schema": dict(schema), "strict": True},
            }
        elif mode == "json_object":
            payload["response_format"] = {"type": "json_object", "schema": dict(schema)}
        return payload

    async def _request(
        self, conversation: list[dict[str, str]], schema: Mapping[str, Any], name: str, budget: int,
        temperature: float,
    ) -> _Answer:  # fmt: skip
        """Send one request in the current mode, walking down the mode ladder if the endpoint refuses it."""
        start_mode = self._mode
        rejections: list[str] = []
        for mode in JSON_MODES[JSON_MODES.index(start_mode) :]:
            payload = self._payload(mode, conversation, schema, name, budget, temperature)
            try:
                answer = await self._send(payload, mode)
            except _FormatRejected as exc:
                rejections.append(f"{mode}: {exc}")
                continue
            if mode != start_mode:
                self._downgrade(mode)
            return answer
        # Even the prompt mode was refused, so the 4xx was not about response_format: keep the configured mode.
        raise JudgeRequestError(self._redact(_short("judge endpoint rejected the request; " + " | ".join(rejections))))

    def _downgrade(self, mode: JsonMode) -> None:
        if JSON_MODES.index(mode) > JSON_MODES.index(self._mode):
            logger.warning("judge endpoint %s refused json_mode %r; using %r from now on", self.url, self._mode, mode)
            self._mode = mode

    def _ensure_loop_state(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._http is None or self._sem is None:
            # asyncio primitives and httpx pools belong to one loop; a new loop gets fresh ones.
            self._loop = loop
            self._http = httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s), transport=self._transport)
            self._sem = asyncio.Semaphore(self.concurrency)
        return self._http, self._sem

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    async def _send(self, payload: dict[str, Any], mode: JsonMode) -> _Answer:
        """POST with retries. Raises _FormatRejected, JudgeRequestError or JudgeUnavailable."""
        http, sem = self._ensure_loop_state()
        attempt = 0
        while True:
            retry_after: float | None = None
            try:
                async with sem:
                    async with asyncio.timeout(self.timeout_s):
                        resp = await http.post(self.url, json=payload, headers=self._headers())
            except (httpx.TransportError, TimeoutError) as exc:  # timeouts, refused/reset connections
                reason = f"{type(exc).__name__}"
            else:
                status = resp.status_code
                if status == 200:
                    answer = self._read_answer(resp)
                    if answer is not None:
                        return answer
                    reason = "HTTP 200 with a malformed chat.completion body"
                elif status in RETRYABLE_STATUSES or status >= 500:
                    if mode != "prompt" and status >= 500 and _names_response_format(resp.text):
                        raise _FormatRejected(self._error_text(resp))
                    reason = f"HTTP {status}"
                    retry_after = retry_after_seconds(resp.headers.get("Retry-After"))
                else:
                    body = resp.text
                    if status == 400 and "max_tokens" in payload and "max_completion_tokens" in body:
                        # Newer OpenAI models refuse max_tokens; resend at once with the field they want.
                        budget = payload.pop("max_tokens")
                        self._token_field = "max_completion_tokens"
                        payload["max_completion_tokens"] = budget
                        continue
                    if mode != "prompt" and (status in (400, 422) or _names_response_format(body)):
                        raise _FormatRejected(self._error_text(resp))
                    raise JudgeRequestError(
                        self._redact(f"judge endpoint rejected the request: {self._error_text(resp)}")
                    )
            if attempt >= self.max_retries:
                raise JudgeUnavailable(
                    self._redact(f"judge endpoint {self.url} unavailable after {attempt + 1} attempts: {reason}")
                )
            delay = jittered_backoff(attempt, self.backoff_s, self.backoff_max_s)
            if retry_after is not None:
                delay = max(delay, min(retry_after, RETRY_AFTER_CAP_S))
            logger.warning(
                "judge request failed (%s); retry %d/%d in %.2fs", reason, attempt + 1, self.max_retries, delay
            )
            await asyncio.sleep(delay)
            attempt += 1

    def _read_answer(self, resp: httpx.Response) -> _Answer | None:
        """The content and usage of an OpenAI chat.completion body, or None if the body is not one."""
        try:
            body = resp.json()
            choice = body["choices"][0]
            message = choice["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            return None
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):  # content parts, as some providers return
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        usage_raw = body.get("usage") if isinstance(body, dict) else None
        usage_raw = usage_raw if isinstance(usage_raw, dict) else {}
        prompt_tokens = _as_int(usage_raw.get("prompt_tokens"))
        completion_tokens = _as_int(usage_raw.get("completion_tokens"))
        usage = Usage(
            calls=1,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cost_usd=(prompt_tokens * self.price_input_per_mtok + completion_tokens * self.price_output_per_mtok)
            / 1_000_000,
        )
        self._usage = self._usage + usage  # billed even if the content turns out invalid
        finish = choice.get("finish_reason") if isinstance(choice, dict) else None
        return _Answer(content=content if isinstance(content, str) else "", finish_reason=finish, usage=usage)

    def _error_text(self, resp: httpx.Response) -> str:
        return f"HTTP {resp.status_code}: {_short(resp.text.strip(), ERROR_SNIPPET_CHARS)}"

    def _redact(self, text: str) -> str:
        if self._api_key:
            text = text.replace(self._api_key, "***")
        return text


def _failure_reason(exc: JudgeError) -> str:
    """The span's and metric's reason for a judge call with no usable answer."""
    if isinstance(exc, JudgeOutputInvalid):
        return "invalid"
    if isinstance(exc, JudgeRequestError):
        return "rejected"
    return "unavailable" if isinstance(exc, JudgeUnavailable) else type(exc).__name__


def _names_response_format(body: str) -> bool:
    return "response_format" in body or "json_schema" in body


def _as_int(value: Any) -> int:
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return 0


def _short(text: str, limit: int = 600) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
