"""`VLLMPolicyClient`: vLLM's OpenAI-compatible server (token-id prompts, exact sampled token ids), plus its runtime
LoRA adapter and sleep-mode routes."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from os import PathLike, fspath
from typing import Any, NoReturn

import httpx

from agent.errors import ContextTooLong, PolicyError, PolicyRequestError, PolicyUnavailable
from agent.policy.completions import (
    check_generate_args,
    drop_suffix,
    first_choice,
    legacy_logprobs,
    make_generation,
    parse_finish_reason,
    smallest_spelling_prefix,
)
from agent.policy.transport import HTTPPolicyBase, error_details
from agent.protocols import ChatMessage, Generation, PromptContext, Served

log = logging.getLogger("agent.policy")  # one logger for the whole client package, named as before the split

VLLM_MAX_STOP_STRINGS = 4  # vLLM's VLLM_MAX_STOP_STRINGS default; more gets a 400
VLLM_RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"  # without it vLLM has no load/unload adapter routes
SLEEP_MODES = ("wait", "abort", "keep")  # what vLLM's /sleep does with running requests


class VLLMPolicyClient(HTTPPolicyBase):
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

    Adapters survive a server restart (issue 63): vLLM forgets runtime-loaded adapters when it restarts, and answers
    404 "The model `x` does not exist." to the next request naming one. The client remembers the folder of every
    adapter it loaded (or saw listed from its folder), and a request pinned to a version (`Served`) carries its
    folder too; when a request naming such an adapter gets that 404, the client loads the adapter again from its
    folder and sends the request once more. A name it knows no folder for fails as before.
    """

    unreachable_hint = "; is vLLM running there? `rubricem policy-server` (or `make policy-server`) starts a local one"

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
        # Adapter name -> the folder (as the server sees it) it was loaded from: loaded again if the server lost it.
        self._adapters: dict[str, str] = {}

    async def render_prompt(self, messages: Sequence[ChatMessage]) -> PromptContext:
        """Render with the server's chat template (`/tokenize` chat form) and detokenize the ids for the text."""
        if not messages:
            raise ValueError("render_prompt needs at least one message")
        data = await self._post_naming(
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
        data = await self._post_naming("/tokenize", {"model": self._model, "prompt": text,
                                                     "add_special_tokens": False})
        return self._read_tokens(data)

    async def generate(
        self,
        context: PromptContext,
        *,
        stop: Sequence[str],
        max_tokens: int,
        temperature: float,
        seed: int | None = None,
        served: Served | None = None,
    ) -> Generation:
        """Sample a continuation of `context` (sent as token ids; as text only when it has no ids).

        `served` pins this request to one version: `served.model` is sent as `model` (and recorded as the
        Generation's `policy_version`) instead of the client's current alias, which stays as it is.

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
        alias = self._alias(served)  # the alias this request is served by, even if set_model() runs meanwhile
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
        data = await self._post_naming("/v1/completions", body, served.adapter if served is not None else None)
        choice = first_choice(data)
        return await self._normalise(choice, alias)

    async def _normalise(self, choice: Mapping[str, Any], alias: str) -> Generation:
        text = choice.get("text")
        if not isinstance(text, str):
            raise PolicyUnavailable("completion choice has no text")
        finish = parse_finish_reason(choice.get("finish_reason"))
        stop_reason = choice.get("stop_reason")
        stop = stop_reason if finish == "stop" and isinstance(stop_reason, str) else None
        ended_on_token = finish == "stop" and stop is None  # EOS (stop_reason null) or a stop_token_ids hit (int)
        pieces, lps = legacy_logprobs(choice.get("logprobs"))
        raw_ids = choice.get("token_ids")
        if not isinstance(raw_ids, list):
            # An older server without return_token_ids: tokenize the text; logprobs only when they line up.
            if ended_on_token and pieces:
                text = drop_suffix(text, pieces[-1])
            ids = await self.tokenize(text)
            k = smallest_spelling_prefix(pieces, text) if pieces is not None else None
            aligned = lps if (k is not None and k == len(ids) and lps is not None) else None
            return make_generation(text, ids, aligned[:k] if aligned else (), finish, stop, alias, "retokenized")
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
            return make_generation(text, await self.tokenize(text), (), finish, stop, alias, "retokenized")
        logprobs = tuple(lps[:keep]) if lps is not None else ()
        return make_generation(spelled, ids[:keep], logprobs, finish, stop, alias, "server")

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
        data = await self._post_naming("/detokenize", {"model": self._model, "tokens": list(ids)})
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
        try:
            resp = await self._lora_request("/v1/load_lora_adapter", body)
        except PolicyRequestError as exc:  # vLLM's message hides the folder ("No adapter found for <path>"): name it
            raise PolicyRequestError(f"{exc} (adapter {name!r} from {lora_path})", status_code=exc.status_code) from exc
        if resp.status_code >= 500:
            message, _ = error_details(resp)
            raise PolicyUnavailable(
                f"POST /v1/load_lora_adapter: vLLM could not load adapter {name!r} from {lora_path}: {message} "
                "(a server started without --enable-lora, or an adapter rank above --max-lora-rank, fails this way)"
            )
        self._adapters[name] = lora_path
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
        try:
            resp = await self._lora_request("/v1/unload_lora_adapter", {"lora_name": name})
        except PolicyRequestError as exc:
            if exc.status_code == 404 and VLLM_RUNTIME_LORA_ENV not in str(exc):
                self._adapters.pop(name, None)  # not loaded there: nothing to load again after a restart
            raise
        if resp.status_code >= 500:
            message, _ = error_details(resp)
            raise PolicyUnavailable(f"POST /v1/unload_lora_adapter: vLLM could not unload {name!r}: {message}")
        self._adapters.pop(name, None)
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
            self._adapters[version] = fspath(path)
            log.info("LoRA adapter %s was already loaded from %s", version, fspath(path))
        self.set_model(version)

    async def served_root(self, name: str) -> str | None:
        """The folder the server loaded `name` from (the `root` of its `/v1/models` card), None when not listed.

        Raises:
            PolicyUnavailable, PolicyTimeout: the server is unreachable or answered something unreadable.
        """
        card = next((c for c in await self._model_cards() if c["id"] == name), None)
        root = card.get("root") if card is not None else None
        return str(root) if card is not None and root is not None else None

    async def ensure_adapter(self, name: str, path: str | PathLike[str]) -> bool:
        """Serve adapter `name` from `path`: load it unless the server already lists it from there, then check that
        `/v1/models` lists it from there. Returns whether this call loaded it (False: it was already served).

        Raises:
            As `load_lora_adapter` (`name` listed from another folder: 400 "already loaded");
            PolicyUnavailable: the load answered 200 but the server does not list the adapter from `path`.
        """
        lora_path = fspath(path)
        if await self.served_root(name) == lora_path:
            self._adapters[name] = lora_path
            return False
        try:
            await self.load_lora_adapter(name, lora_path)
        except PolicyRequestError as exc:  # a concurrent publisher may have loaded it first
            if exc.status_code != 400 or await self.served_root(name) != lora_path:
                raise
            self._adapters[name] = lora_path
            return False
        if await self.served_root(name) != lora_path:
            raise PolicyUnavailable(f"vLLM answered that adapter {name!r} was loaded, but /v1/models does not list it "
                                    f"from {lora_path}")
        return True

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

    def known_adapters(self) -> dict[str, str]:
        """The adapters this client would load again after a server restart: name -> folder (as the server sees it)."""
        return dict(self._adapters)

    def remember_adapter(self, name: str, path: str | PathLike[str]) -> None:
        """Record that adapter `name` is served from folder `path` (loaded by someone else, e.g. another replica's
        promoter): a request naming it after the server lost it loads it again from there."""
        if name and fspath(path):
            self._adapters[name] = fspath(path)

    async def _post_naming(self, path: str, body: Mapping[str, Any], adapter: str | None = None) -> dict[str, Any]:
        """POST a request that names a model (`body["model"]`), restoring an adapter the server lost (a restart).

        When the server answers 404 "The model `x` does not exist." and `x` is an adapter whose folder is known
        (`adapter`, the folder the request is pinned to, else the one this client loaded it from), the adapter is
        loaded again from that folder (`_restore_adapter`) and the request is sent once more; any other failure, or a
        second 404, is raised as it is.
        """
        try:
            return await self._post(path, body)
        except PolicyRequestError as exc:
            name = str(body.get("model") or "")
            folder = adapter or self._adapters.get(name)
            if exc.status_code != 404 or not folder or not _model_missing(exc, name):
                raise
            await self._restore_adapter(name, folder, exc)
        return await self._post(path, body)

    async def _restore_adapter(self, name: str, folder: str, cause: PolicyRequestError) -> None:
        """Load adapter `name` from `folder` again after the server answered that it does not exist.

        Raises:
            PolicyRequestError: the load was refused (the folder is gone, runtime updating is off: the reason given)
                and no concurrent request loaded it meanwhile.
            PolicyUnavailable, PolicyTimeout: as `load_lora_adapter`.
        """
        log.warning("vLLM at %s no longer serves LoRA adapter %s (it restarted?): loading it again from %s",
                    self._shown_root, name, folder)
        try:
            await self.load_lora_adapter(name, folder)
        except PolicyRequestError as exc:  # 400 "already loaded": another request restored it first
            if exc.status_code == 400 and await self.served_root(name) == folder:
                self._adapters[name] = folder
                return
            raise PolicyRequestError(f"{cause}; loading adapter {name!r} again from {folder} failed: {exc}",
                                     status_code=exc.status_code) from exc

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
    message, _ = error_details(resp)
    try:
        data = resp.json()
    except ValueError:
        data = None
    if isinstance(data, dict) and "error" not in data and data.get("detail") == "Not Found":
        raise PolicyRequestError(f"{method} {path}: the server has no such route; {hint}", status_code=404)
    raise PolicyRequestError(f"{method} {path}: 404: {message}", status_code=404)


def _model_missing(exc: PolicyRequestError, name: str) -> bool:
    """Whether a 404 is vLLM's "The model `name` does not exist." (an unknown model name, not a missing route)."""
    text = str(exc)
    return "does not exist" in text and f"`{name}`" in text


def _json_object(label: str, resp: httpx.Response) -> dict[str, Any]:
    try:
        data = resp.json()
    except ValueError as exc:
        raise PolicyUnavailable(f"{label}: the server answered {resp.status_code} with a non-JSON body") from exc
    if not isinstance(data, dict):
        raise PolicyUnavailable(f"{label}: expected a JSON object, got {type(data).__name__}")
    return data
