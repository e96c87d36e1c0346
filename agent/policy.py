"""HTTP policy clients: vLLM's OpenAI server (token-id prompts, exact token ids) and llama-cpp-python's (text only).

Both normalise a completion to `agent.protocols.Generation`, retry transient failures with backoff and map the rest to
the typed errors of `agent.errors`. Pure httpx; no torch.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import Collection, Mapping, Sequence
from os import PathLike, fspath
from typing import TYPE_CHECKING, Any, NoReturn, Self

import httpx

from agent.errors import (
    ContextTooLong,
    PolicyError,
    PolicyRateLimited,
    PolicyRequestError,
    PolicyTimeout,
    PolicyUnavailable,
)
from agent.protocols import ChatMessage, Generation, PromptContext
from agent.retry import jittered_backoff, retry_after_seconds
from store.records import FinishReason, TokenSource

if TYPE_CHECKING:
    from agent.config import AgentConfig

log = logging.getLogger(__name__)

VLLM_MAX_STOP_STRINGS = 4  # vLLM's VLLM_MAX_STOP_STRINGS default; more gets a 400
VLLM_RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"  # without it vLLM has no load/unload adapter routes
SLEEP_MODES = ("wait", "abort", "keep")  # what vLLM's /sleep does with running requests
SMOLLM2_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# Phrases servers use when the prompt does not fit (vLLM 400 messages, llama-cpp-python's "context_length_exceeded").
_CONTEXT_PATTERNS = re.compile(
    r"maximum context length|maximum model length|context window|context_length_exceeded|prompt is too long"
    r"|is longer than the maximum",
    re.IGNORECASE,
)
_FINISH_REASONS: Mapping[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "abort": "abort",
    "repetition": "length",  # vLLM's repetition detector cut it: a limit, not the model's own end
    "error": "error",
}


def check_generate_args(stop: Sequence[str], max_tokens: int, temperature: float) -> tuple[str, ...]:
    """Validate the arguments every `PolicyClient.generate` takes; return the stop strings as a tuple.

    Raises:
        TypeError: `stop` is a single string. ValueError: an empty stop string, `max_tokens` < 1, or a negative or
            non-finite temperature.
    """
    if isinstance(stop, str):
        raise TypeError("stop must be a sequence of strings, not a single string")
    stops = tuple(stop)
    if any(not isinstance(s, str) or not s for s in stops):
        raise ValueError("stop strings must be non-empty strings")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive integer, not {max_tokens!r}")
    if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0, not {temperature!r}")
    return stops


def _smallest_spelling_prefix(pieces: Sequence[str], text: str) -> int | None:
    """The smallest k with `"".join(pieces[:k]) == text`, or None when no prefix of the pieces spells `text`."""
    if text == "":
        return 0
    acc = ""
    for k, piece in enumerate(pieces, start=1):
        acc += piece
        if acc == text:
            return k
        if len(acc) >= len(text):
            return None
    return None


class _HTTPPolicyBase:
    """Shared transport: one `httpx.AsyncClient`, retries with backoff and jitter, error mapping."""

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

    def set_model(self, alias: str) -> None:
        """Switch the served alias for later requests (a request in flight keeps the alias it started with)."""
        if not alias:
            raise ValueError("alias must not be empty")
        self._model = alias

    @classmethod
    def from_config(cls, config: AgentConfig, transport: httpx.AsyncBaseTransport | None = None) -> Self:
        """A client for the policy endpoint described by the agent settings."""
        key = config.policy_api_key.get_secret_value() if config.policy_api_key is not None else None
        return cls(
            config.policy_base_url,
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
                    f"{method} {path}: cannot reach the policy server ({type(exc).__name__}: {exc})"
                )
            else:
                status = resp.status_code
                log.debug("%s %s -> %d in %.2fs", method, path, status, time.monotonic() - started)
                if status < 400 or status in passthrough:
                    return resp
                message, code = _error_details(resp)
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


def _error_details(resp: httpx.Response) -> tuple[str, str | None]:
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


def _finish_reason(value: object) -> FinishReason:
    return _FINISH_REASONS.get(str(value), "error") if value is not None else "error"


# --------------------------------------------------------------------------------------------------------------------
# vLLM
# --------------------------------------------------------------------------------------------------------------------


class VLLMPolicyClient(_HTTPPolicyBase):
    """`PolicyClient` for vLLM's OpenAI-compatible server (API_FACTS.md §1, §3).

    Prompts are sent as token ids to `/v1/completions`, so the assistant sequence is exactly what was sampled. The
    request sets `include_stop_str_in_output`, so the closing tag the model sampled stays in the turn and is trained
    (STYLE.md §3, METHOD.md D6). vLLM returns every sampled id (`return_token_ids`) up to the one that completed the
    stop string, and the EOS id too. `text` is always exactly what `token_ids` spell, and `logprobs` align with them:

    * A stop string (`stop_reason` is that string): every id is kept. The server's `text` ends at the stop string's
      end, but the last token may run past it (the stop `"</answer>"` completed by a token `">\n"`), so `text` is
      the ids decoded with one `/detokenize` call, which starts with the server's text and may be a few characters
      longer. If the decoding does not start with the server's text, the ids are unusable: the server's text is
      retokenized (`token_source="retokenized"`, no logprobs).
    * EOS or a stop token id (`finish_reason` "stop", `stop_reason` null or int): the last id is dropped. With
      `include_stop_str_in_output` vLLM puts that token's text (e.g. `<|im_end|>`) in its `text` as well, so it is
      cut off: by the last `logprobs.tokens` string, or by `/detokenize` when those strings are missing.
    * `max_tokens` reached: every id is kept and `text` is the server's.

    Logprobs are vLLM's defaults: raw (before temperature) unless the server runs with
    `--logprobs-mode processed_logprobs`.

    Hot swap (API_FACTS.md §4, §5): `aload_adapter(path, version)` loads a LoRA adapter at run time and sends
    `version` as `model` from then on; each request keeps (and its `Generation.policy_version` records) the alias it
    was sent with, so requests in flight finish on the version they started with. `unload_lora_adapter`,
    `list_models`, `sleep`, `wake_up` and `is_sleeping` wrap the other management routes.
    """

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
        """Create the client (no request is made).

        Args:
            base_url: server root, e.g. "http://127.0.0.1:8000" (no /v1).
            model: the served model or LoRA alias sent as `model`; it is the policy version.
            api_key: sent as `Authorization: Bearer`; never logged.
            timeout_s: per-request timeout.
            max_retries: retries on 429, 5xx, connection errors and timeouts.
            transport: an httpx transport (tests inject one).
            backoff_s: first retry delay (doubles each retry, with jitter), capped by `backoff_max_s`.
        """
        super().__init__(base_url, model, api_key, timeout_s, max_retries, transport, backoff_s, backoff_max_s)
        self._max_model_len: int | None = None

    async def render_prompt(self, messages: Sequence[ChatMessage]) -> PromptContext:
        """Render with the server's chat template (`/tokenize` chat form) and detokenize the ids for the text."""
        if not messages:
            raise ValueError("render_prompt needs at least one message")
        data = await self._post(
            "/tokenize",
            {
                "model": self._model,
                "messages": [{"role": m.role, "content": m.content} for m in messages],
                "add_generation_prompt": True,
                "add_special_tokens": False,
            },
        )
        ids = self._read_tokens(data)
        text = await self._detokenize(ids)
        return PromptContext(text=text, token_ids=ids)

    async def tokenize(self, text: str) -> tuple[int, ...]:
        """Tokenize inserted text with the served tokenizer, without special tokens."""
        if not text:
            return ()
        data = await self._post("/tokenize", {"model": self._model, "prompt": text, "add_special_tokens": False})
        return self._read_tokens(data)

    async def generate(
        self,
        context: PromptContext,
        *,
        stop: Sequence[str],
        max_tokens: int,
        temperature: float,
        seed: int | None = None,
    ) -> Generation:
        """Sample a continuation of `context` (sent as token ids; as text only when it has no ids).

        Raises:
            ValueError: more than 4 stop strings (vLLM's limit), an empty stop string or prompt, bad numbers.
            ContextTooLong: the prompt does not fit the served context window.
            PolicyTimeout, PolicyUnavailable, PolicyRateLimited, PolicyRequestError: see `agent.errors`.
        """
        stops = list(check_generate_args(stop, max_tokens, temperature))
        if len(stops) > VLLM_MAX_STOP_STRINGS:
            raise ValueError(f"vLLM accepts at most {VLLM_MAX_STOP_STRINGS} stop strings, got {len(stops)}")
        prompt: list[int] | str = [int(i) for i in context.token_ids] or context.text
        if not prompt:
            raise ValueError("generate needs a non-empty prompt")
        if self._max_model_len is not None and isinstance(prompt, list) and len(prompt) >= self._max_model_len:
            raise ContextTooLong(f"prompt has {len(prompt)} tokens; the served context window is {self._max_model_len}")
        alias = self._model  # the alias this request is served by, even if set_model() runs meanwhile
        body: dict[str, Any] = {
            "model": alias,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": float(temperature),
            "top_p": 1.0,
            "n": 1,
            "stop": stops,
            "include_stop_str_in_output": True,  # keep the sampled closing tag: it is trained (METHOD.md D6)
            "logprobs": 1,
            "return_token_ids": True,
            "skip_special_tokens": False,
        }
        if seed is not None:
            body["seed"] = int(seed)
        data = await self._post("/v1/completions", body)
        choice = _first_choice(data)
        return await self._normalise(choice, alias)

    async def _normalise(self, choice: Mapping[str, Any], alias: str) -> Generation:
        text = choice.get("text")
        if not isinstance(text, str):
            raise PolicyUnavailable("completion choice has no text")
        finish = _finish_reason(choice.get("finish_reason"))
        stop_reason = choice.get("stop_reason")
        stop = stop_reason if finish == "stop" and isinstance(stop_reason, str) else None
        ended_on_token = finish == "stop" and stop is None  # EOS (stop_reason null) or a stop_token_ids hit (int)
        pieces, lps = _legacy_logprobs(choice.get("logprobs"))
        raw_ids = choice.get("token_ids")
        if not isinstance(raw_ids, list):
            # An older server without return_token_ids: tokenize the text; logprobs only when they line up.
            if ended_on_token and pieces:
                text = _drop_suffix(text, pieces[-1])
            ids = await self.tokenize(text)
            k = _smallest_spelling_prefix(pieces, text) if pieces is not None else None
            aligned = lps if (k is not None and k == len(ids) and lps is not None) else None
            return _generation(text, ids, aligned[:k] if aligned else (), finish, stop, alias, "retokenized")
        ids = tuple(int(i) for i in raw_ids)
        if lps is not None and len(lps) != len(ids):
            pieces, lps = None, None
        keep = len(ids)
        spelled: str | None = text
        if stop is not None:
            # The ids run through the token that completed the stop string, which may end past the stop string.
            decoded = await self._detokenize(ids)
            spelled = decoded if decoded.startswith(text) else None
        elif ended_on_token and ids:
            keep = len(ids) - 1
            spelled = await self._text_before_last(ids, pieces, text)
        if spelled is None:  # the ids do not decode to the server's text: fall back to the text alone
            return _generation(text, await self.tokenize(text), (), finish, stop, alias, "retokenized")
        logprobs = tuple(lps[:keep]) if lps is not None else ()
        return _generation(spelled, ids[:keep], logprobs, finish, stop, alias, "server")

    async def _text_before_last(self, ids: tuple[int, ...], pieces: list[str] | None, text: str) -> str | None:
        """The text of all ids but the last (the EOS or stop token), whose text the server appended; None if unsure."""
        last = pieces[-1] if pieces is not None else await self._detokenize(ids[-1:])
        if last and text.endswith(last):
            return text[: len(text) - len(last)]
        # The token's text is not at the end (a server that left it out, or strings that do not line up): decode.
        decoded = await self._detokenize(ids[:-1])
        return decoded if text.startswith(decoded) and len(text) - len(decoded) <= len(last) else None

    async def _detokenize(self, ids: Sequence[int]) -> str:
        if not ids:
            return ""
        data = await self._post("/detokenize", {"model": self._model, "tokens": list(ids)})
        text = data.get("prompt")
        if not isinstance(text, str):
            raise PolicyUnavailable("/detokenize answered without a `prompt` string")
        return text

    def _read_tokens(self, data: Mapping[str, Any]) -> tuple[int, ...]:
        tokens = data.get("tokens")
        if not isinstance(tokens, list):
            raise PolicyUnavailable("/tokenize answered without a `tokens` list")
        max_len = data.get("max_model_len")
        if isinstance(max_len, int) and max_len > 0:
            self._max_model_len = max_len
        return tuple(int(t) for t in tokens)

    # -- runtime LoRA adapters and sleep mode (API_FACTS.md §4, §5) --------------------------------------------------

    async def list_models(self) -> list[str]:
        """The names the server answers to (`GET /v1/models`): the base model first, then each loaded LoRA adapter.

        Raises:
            PolicyUnavailable, PolicyTimeout: the server is unreachable or answered something unreadable.
        """
        return [str(card["id"]) for card in await self._model_cards()]

    async def load_lora_adapter(self, name: str, path: str | PathLike[str], *, load_inplace: bool = False) -> None:
        """Load the LoRA adapter folder `path` (as the server sees it) under `name` (`POST /v1/load_lora_adapter`).

        Requests that send `name` as `model` are then served by it. The call is not retried: a repeat after a lost
        answer would get "already loaded" (`aload_adapter` treats that case as success).

        Raises:
            ValueError: an empty name or path.
            PolicyRequestError: the server cannot update adapters at run time (404; the message names
                VLLM_ALLOW_RUNTIME_LORA_UPDATING), no adapter at `path` (404), `name` already loaded without
                `load_inplace` or missing fields (400).
            PolicyUnavailable: the engine failed to load it (500: a server without --enable-lora, an adapter rank
                above --max-lora-rank, ...) or the server is unreachable.
        """
        lora_path = fspath(path)
        if not name or not lora_path:
            raise ValueError("load_lora_adapter needs a non-empty adapter name and path")
        body = {"lora_name": name, "lora_path": lora_path, "load_inplace": bool(load_inplace)}
        resp = await self._lora_request("/v1/load_lora_adapter", body)
        if resp.status_code >= 500:
            message, _ = _error_details(resp)
            raise PolicyUnavailable(
                f"POST /v1/load_lora_adapter: vLLM could not load adapter {name!r} from {lora_path}: {message} "
                "(a server started without --enable-lora, or an adapter rank above --max-lora-rank, fails this way)"
            )
        log.info("vLLM loaded LoRA adapter %s from %s", name, lora_path)

    async def unload_lora_adapter(self, name: str) -> None:
        """Remove the adapter `name` from the server (`POST /v1/unload_lora_adapter`); not retried.

        Requests already running on it finish on it; later requests naming it get 404. Unload a version only once
        no client sends it any more (the promoter waits a grace period after flipping the live alias).

        Raises:
            ValueError: an empty name.
            PolicyRequestError: runtime updating disabled (404, names VLLM_ALLOW_RUNTIME_LORA_UPDATING), or no
                adapter of that name is loaded (404).
            PolicyUnavailable: an engine failure (500) or the server is unreachable.
        """
        if not name:
            raise ValueError("unload_lora_adapter needs a non-empty adapter name")
        resp = await self._lora_request("/v1/unload_lora_adapter", {"lora_name": name})
        if resp.status_code >= 500:
            message, _ = _error_details(resp)
            raise PolicyUnavailable(f"POST /v1/unload_lora_adapter: vLLM could not unload {name!r}: {message}")
        log.info("vLLM unloaded LoRA adapter %s", name)

    async def aload_adapter(self, path: str | PathLike[str], version: str) -> None:
        """Publish a new policy version: load the adapter at `path` as `version`, then send `version` from now on.

        Requests in flight keep the version they were sent with. Loading a version that is already loaded from the
        same folder (a repeated publish) is not an error.

        Raises:
            As `load_lora_adapter`; on any failure the client keeps sending the previous version.
        """
        try:
            await self.load_lora_adapter(version, path)
        except PolicyRequestError as exc:
            if exc.status_code != 400 or not await self._serves(version, fspath(path)):
                raise
            log.info("LoRA adapter %s was already loaded from %s", version, fspath(path))
        self.set_model(version)

    async def aunload_adapter(self) -> None:
        """Go back to the base model: send the adapter's parent from now on, then unload the adapter.

        A no-op when the client already sends a base model (or a name the server does not list). An adapter that
        someone else unloaded meanwhile is not an error.

        Raises:
            PolicyRequestError, PolicyUnavailable, PolicyTimeout: as `unload_lora_adapter`; the client then keeps
                sending the adapter.
        """
        current = self._model
        card = next((c for c in await self._model_cards() if c["id"] == current), None)
        parent = card.get("parent") if card is not None else None
        if not isinstance(parent, str) or not parent:
            return
        self.set_model(parent)  # first stop sending the adapter, then remove it
        try:
            await self.unload_lora_adapter(current)
        except PolicyRequestError as exc:
            if exc.status_code == 404 and VLLM_RUNTIME_LORA_ENV not in str(exc):
                return  # someone else unloaded it already
            self.set_model(current)  # the adapter is still there: keep serving it, as before the call
            raise
        except PolicyError:
            self.set_model(current)
            raise

    async def sleep(self, level: int = 1, mode: str = "wait") -> None:
        """Put the engine to sleep (`POST /sleep`) to free the GPU, e.g. for training in one-GPU mode.

        Args:
            level: 0 pauses scheduling; 1 offloads the weights to CPU and drops the KV cache; 2 drops both.
            mode: "wait" (default here) lets running requests finish first; "abort" ends them with
                finish_reason "abort" (vLLM's own default); "keep" pauses them until wake-up. Requests that arrive
                while asleep are queued by the server, not refused.

        Raises:
            ValueError: a level or mode vLLM does not know.
            PolicyRequestError: the server has no sleep routes (its message names VLLM_SERVER_DEV_MODE).
            PolicyUnavailable, PolicyTimeout: the server failed or is unreachable.
        """
        if level not in (0, 1, 2) or isinstance(level, bool):
            raise ValueError(f"sleep level must be 0, 1 or 2, not {level!r}")
        if mode not in SLEEP_MODES:
            raise ValueError(f"sleep mode must be one of {', '.join(SLEEP_MODES)}, not {mode!r}")
        await self._dev_request("POST", "/sleep", params={"level": level, "mode": mode})
        log.info("vLLM put to sleep (level %d, mode %s)", level, mode)

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Wake the engine (`POST /wake_up`); `tags` ("weights", "kv_cache", "scheduling") wake it in stages.

        Raises:
            PolicyRequestError: the server has no sleep routes (its message names VLLM_SERVER_DEV_MODE) or refused a
                tag.
            PolicyUnavailable, PolicyTimeout: the server failed or is unreachable.
        """
        if isinstance(tags, str):
            raise TypeError("tags must be a sequence of strings, not a single string")
        params = {"tags": list(tags)} if tags else None
        await self._dev_request("POST", "/wake_up", params=params)
        log.info("vLLM woken up (tags %s)", list(tags) if tags else "all")

    async def is_sleeping(self) -> bool:
        """Whether the engine is asleep or paused (`GET /is_sleeping`).

        Raises:
            PolicyRequestError: the server has no sleep routes (its message names VLLM_SERVER_DEV_MODE).
            PolicyUnavailable, PolicyTimeout: the server failed, is unreachable or answered without the flag.
        """
        data = _json_object("GET /is_sleeping", await self._dev_request("GET", "/is_sleeping"))
        flag = data.get("is_sleeping")
        if not isinstance(flag, bool):
            raise PolicyUnavailable("GET /is_sleeping answered without an `is_sleeping` boolean")
        return flag

    async def _model_cards(self) -> list[dict[str, Any]]:
        data = _json_object("GET /v1/models", await self._send("GET", "/v1/models"))
        cards = data.get("data")
        if not isinstance(cards, list) or not all(isinstance(c, dict) and isinstance(c.get("id"), str) for c in cards):
            raise PolicyUnavailable("GET /v1/models answered without a `data` list of model cards")
        return cards

    async def _serves(self, name: str, path: str) -> bool:
        """Whether the server lists adapter `name` loaded from `path`."""
        return any(c["id"] == name and c.get("root") == path for c in await self._model_cards())

    async def _lora_request(self, path: str, body: Mapping[str, Any]) -> httpx.Response:
        """POST a runtime-LoRA request once; 5xx comes back to the caller, a missing route becomes a clear error."""
        resp = await self._send("POST", path, body=body, retries=0, passthrough=(404, 500))
        if resp.status_code == 404:
            hint = f"start vLLM with {VLLM_RUNTIME_LORA_ENV}=1 (and --enable-lora) to load and unload LoRA adapters"
            _raise_not_found("POST", path, resp, hint)
        return resp

    async def _dev_request(self, method: str, path: str, params: Mapping[str, Any] | None = None) -> httpx.Response:
        """A sleep-mode request; a missing route (a server without dev mode) becomes a clear error."""
        resp = await self._send(method, path, params=params, passthrough=(404,))
        if resp.status_code == 404:
            _raise_not_found(
                method, path, resp, "start vLLM with VLLM_SERVER_DEV_MODE=1 and --enable-sleep-mode to use sleep mode"
            )
        return resp


def _raise_not_found(method: str, path: str, resp: httpx.Response, hint: str) -> NoReturn:
    """Raise for a 404: FastAPI's bare `{"detail": "Not Found"}` means the route itself is absent (`hint` says why)."""
    message, _ = _error_details(resp)
    try:
        data = resp.json()
    except ValueError:
        data = None
    if isinstance(data, dict) and "error" not in data and data.get("detail") == "Not Found":
        raise PolicyRequestError(f"{method} {path}: the server has no such route; {hint}", status_code=404)
    raise PolicyRequestError(f"{method} {path}: 404: {message}", status_code=404)


def _json_object(label: str, resp: httpx.Response) -> dict[str, Any]:
    try:
        data = resp.json()
    except ValueError as exc:
        raise PolicyUnavailable(f"{label}: the server answered {resp.status_code} with a non-JSON body") from exc
    if not isinstance(data, dict):
        raise PolicyUnavailable(f"{label}: expected a JSON object, got {type(data).__name__}")
    return data


# --------------------------------------------------------------------------------------------------------------------
# llama-cpp-python server
# --------------------------------------------------------------------------------------------------------------------


def render_chatml(messages: Sequence[ChatMessage], default_system: str | None = SMOLLM2_DEFAULT_SYSTEM) -> str:
    """Render messages the way SmolLM2's chat template does, with the assistant generation prompt.

    `<|im_start|>{role}\\n{content}<|im_end|>\\n` per message, then `<|im_start|>assistant\\n`. When the first message
    is not a system message, `default_system` (SmolLM2's own default) is put first, as the template does; pass None to
    leave it out.
    """
    parts: list[str] = []
    if default_system is not None and (not messages or messages[0].role != "system"):
        parts.append(f"<|im_start|>system\n{default_system}<|im_end|>\n")
    parts.extend(f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in messages)
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)


class LlamaCppPolicyClient(_HTTPPolicyBase):
    """`PolicyClient` for llama-cpp-python's OpenAI-compatible server (API_FACTS.md §7): the CPU dev/test path.

    That server takes text prompts only, returns no token ids and no stop reason, and drops the stop string from the
    text. The client therefore:

    * renders ChatML itself (`render_chatml`) and tokenizes it with `/extras/tokenize`. That endpoint parses special
      tokens and adds BOS only when the GGUF asks for it (SmolLM2 does not); whatever it adds to an empty string is
      stripped from `tokenize()` results, so inserted text never carries a BOS.
    * finds the stop string that ended a generation with the server's own rule: it cuts at the first stop string *in
      list order* that occurs in the decoded continuation. The per-token strings in `logprobs.tokens` cover every
      sampled token, including those that spelled the stop string (not the EOS). If those strings spell `text`
      followed by more characters, the matched stop is the first listed stop string whose first occurrence in the
      joined strings starts right where `text` ends. If nothing follows `text` the model emitted EOS (`stop` = None).
      When the strings do not spell `text` (e.g. a UTF-8 character split across tokens) the stop is unknown: None.
    * gets `token_ids` by tokenizing the returned text (`token_source="retokenized"`): approximate, never to be
      trained on as sampled ids. `logprobs` are kept only when the tokens that spell `text` are exactly as many as
      the retokenized ids; otherwise they are left empty.

    Logprobs are llama.cpp's raw ones (log-softmax of the logits before temperature).
    """

    def __init__(
        self,
        base_url: str,
        model: str = "smollm2",
        api_key: str | None = None,
        timeout_s: float = 300.0,
        max_retries: int = 4,
        transport: httpx.AsyncBaseTransport | None = None,
        backoff_s: float = 0.5,
        backoff_max_s: float = 8.0,
        default_system: str | None = SMOLLM2_DEFAULT_SYSTEM,
    ) -> None:
        """Create the client (no request is made).

        Args:
            base_url: server root, e.g. "http://127.0.0.1:8002" (no /v1).
            model: the `--model_alias` the server was started with; it is the policy version.
            default_system: system prompt the template injects when the messages have none (SmolLM2's default).
            Other arguments as for `VLLMPolicyClient`.
        """
        super().__init__(base_url, model, api_key, timeout_s, max_retries, transport, backoff_s, backoff_max_s)
        self._default_system = default_system
        self._implicit_prefix: tuple[int, ...] | None = None

    async def render_prompt(self, messages: Sequence[ChatMessage]) -> PromptContext:
        """Render ChatML in the client and tokenize it exactly as the server will tokenize the prompt text."""
        if not messages:
            raise ValueError("render_prompt needs at least one message")
        text = render_chatml(messages, self._default_system)
        return PromptContext(text=text, token_ids=await self._tokenize_raw(text))

    async def tokenize(self, text: str) -> tuple[int, ...]:
        """Tokenize inserted text; a BOS the server adds by itself is stripped."""
        if not text:
            return ()
        prefix = await self._prefix()
        ids = await self._tokenize_raw(text)
        return ids[len(prefix) :] if prefix and ids[: len(prefix)] == prefix else ids

    async def generate(
        self,
        context: PromptContext,
        *,
        stop: Sequence[str],
        max_tokens: int,
        temperature: float,
        seed: int | None = None,
    ) -> Generation:
        """Sample a continuation of `context.text` (the server takes no token ids).

        Raises:
            ValueError: an empty prompt or stop string, bad numbers.
            ContextTooLong, PolicyTimeout, PolicyUnavailable, PolicyRateLimited, PolicyRequestError.
        """
        stops = list(check_generate_args(stop, max_tokens, temperature))
        if not context.text:
            raise ValueError("generate needs a non-empty prompt text (the llama.cpp server takes no token ids)")
        alias = self._model
        body: dict[str, Any] = {
            "model": alias,
            "prompt": context.text,
            "max_tokens": max_tokens,  # >= 1 checked: the server reads <= 0 as "until the context is full"
            "temperature": float(temperature),
            "top_p": 1.0,
            "stop": stops,
            "logprobs": 1,
        }
        if seed is not None:
            body["seed"] = int(seed)
        data = await self._post("/v1/completions", body)
        choice = _first_choice(data)
        text = choice.get("text")
        if not isinstance(text, str):
            raise PolicyUnavailable("completion choice has no text")
        finish = _finish_reason(choice.get("finish_reason"))
        pieces, lps = _legacy_logprobs(choice.get("logprobs"))
        k = _smallest_spelling_prefix(pieces, text) if pieces is not None else None
        matched = _matched_stop(pieces, k, text, stops) if finish == "stop" else None
        ids = await self.tokenize(text)
        logprobs = tuple(lps[:k]) if (lps is not None and k is not None and k == len(ids)) else ()
        return _generation(text, ids, logprobs, finish, matched, alias, "retokenized")

    async def _prefix(self) -> tuple[int, ...]:
        if self._implicit_prefix is None:
            # What the server adds on its own (BOS for models that want one): the tokens of the empty string.
            self._implicit_prefix = await self._tokenize_raw("")
        return self._implicit_prefix

    async def _tokenize_raw(self, text: str) -> tuple[int, ...]:
        data = await self._post("/extras/tokenize", {"input": text})
        tokens = data.get("tokens")
        if not isinstance(tokens, list):
            raise PolicyUnavailable("/extras/tokenize answered without a `tokens` list")
        return tuple(int(t) for t in tokens)


def _matched_stop(pieces: list[str] | None, k: int | None, text: str, stops: Sequence[str]) -> str | None:
    """Replays llama-cpp-python's stop rule on the returned token strings (see `LlamaCppPolicyClient`)."""
    if pieces is None or k is None:
        return None
    full = "".join(pieces)
    if len(full) == len(text):
        return None  # nothing sampled after the text: EOS
    for s in stops:  # the server takes the first stop in list order that occurs anywhere in the continuation
        if full.find(s) == len(text):
            return s
        if s in full:
            return None  # the server would have cut at this stop instead; the strings are not what it saw
    return None


# --------------------------------------------------------------------------------------------------------------------
# shared response helpers
# --------------------------------------------------------------------------------------------------------------------


def _drop_suffix(text: str, suffix: str) -> str:
    return text[: len(text) - len(suffix)] if suffix and text.endswith(suffix) else text


def _first_choice(data: Mapping[str, Any]) -> Mapping[str, Any]:
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise PolicyUnavailable("completion response has no choices")
    return choices[0]


def _legacy_logprobs(obj: object) -> tuple[list[str] | None, list[float] | None]:
    """`tokens` and `token_logprobs` of an OpenAI legacy logprobs object, or (None, None) when unusable."""
    if not isinstance(obj, dict):
        return None, None
    tokens = obj.get("tokens")
    values = obj.get("token_logprobs")
    if not isinstance(tokens, list) or not isinstance(values, list) or len(tokens) != len(values):
        return None, None
    if not all(isinstance(t, str) for t in tokens) or not all(isinstance(v, (int, float)) for v in values):
        return None, None
    return list(tokens), [float(v) for v in values]


def _generation(
    text: str,
    ids: Sequence[int],
    logprobs: Sequence[float],
    finish: FinishReason,
    stop: str | None,
    version: str,
    source: TokenSource,
) -> Generation:
    return Generation(
        text=text,
        token_ids=tuple(ids),
        logprobs=tuple(logprobs) if len(logprobs) == len(ids) else (),
        finish_reason=finish,
        stop=stop,
        policy_version=version,
        token_source=source,
    )
