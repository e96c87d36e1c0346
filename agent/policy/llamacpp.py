"""`LlamaCppPolicyClient`: llama-cpp-python's OpenAI-compatible server (text prompts only), the CPU dev/test path,
with the client-side ChatML rendering it needs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from agent.errors import PolicyUnavailable
from agent.policy.completions import (
    check_generate_args,
    first_choice,
    legacy_logprobs,
    make_generation,
    parse_finish_reason,
    smallest_spelling_prefix,
)
from agent.policy.transport import HTTPPolicyBase
from agent.protocols import ChatMessage, Generation, PromptContext, Served

SMOLLM2_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


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


class LlamaCppPolicyClient(HTTPPolicyBase):
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
        served: Served | None = None,
    ) -> Generation:
        """Sample a continuation of `context.text` (the server takes no token ids).

        `served` pins this request to one version: `served.model` is sent as `model` (and recorded as the
        Generation's `policy_version`) instead of the client's current alias, which stays as it is.

        Raises:
            ValueError: an empty prompt or stop string, bad numbers.
            ContextTooLong, PolicyTimeout, PolicyUnavailable, PolicyRateLimited, PolicyRequestError.
        """
        stops = list(check_generate_args(stop, max_tokens, temperature))
        if not context.text:
            raise ValueError("generate needs a non-empty prompt text (the llama.cpp server takes no token ids)")
        alias = self._alias(served)
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
        choice = first_choice(data)
        text = choice.get("text")
        if not isinstance(text, str):
            raise PolicyUnavailable("completion choice has no text")
        finish = parse_finish_reason(choice.get("finish_reason"))
        pieces, lps = legacy_logprobs(choice.get("logprobs"))
        k = smallest_spelling_prefix(pieces, text) if pieces is not None else None
        matched = _matched_stop(pieces, k, text, stops) if finish == "stop" else None
        ids = await self.tokenize(text)
        logprobs = tuple(lps[:k]) if (lps is not None and k is not None and k == len(ids)) else ()
        return make_generation(text, ids, logprobs, finish, matched, alias, "retokenized")

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
