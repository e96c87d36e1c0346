"""What the two embedded `PolicyClient`s share above the forward pass: argument checks, the chat template and
tokenizer, the async surface over one model lock, and the adapter-folder check.

Why a base class: `TransformersPolicyClient` (torch) and `EmbeddedLlamaCppClient` (llama.cpp) must answer every
request the same way (same token ids, same sampler, same errors) so that either can serve the agent and feed the
trainer. A subclass says how to prefill, step, score, close and swap adapters; everything a caller sees is here.

Both hold one lock for a whole request, run it in a worker thread (`asyncio.to_thread`), and take the same lock for
an adapter swap, so a request in progress finishes on the old weights and the next one uses the new ones. The lock is
reentrant so that a request pinned to a version (`generate(..., served=...)`, issue 49) can hold it across the swap
and the generation: no other session's request can slip in between and be answered by the wrong adapter.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent.errors import ContextTooLong, PolicyUnavailable
from agent.policy import check_generate_args
from agent.protocols import ChatMessage, Generation, PromptContext, Served


class AdapterLoadError(ValueError):
    """A LoRA adapter folder is missing, malformed or does not fit the base model; the old weights stay active."""


class EmbeddedClient:
    """The shared half of an in-process policy client (module docstring). Subclasses set `_tokenizer`, `_eos_ids`,
    `_max_context`, and implement `policy_version`, `_generate_locked`, `_group_locked`, `_score_locked`,
    `_release`, `load_adapter` and `unload_adapter`.

    Stop strings are matched on the decoded continuation after every token, so they may span tokens. Generation ends
    at the token that completes a stop string, and that token is kept with every token before it: the closing tag the
    model sampled is trained (STYLE.md §3, METHOD.md D6). `text` is always `decode(token_ids)`, so it ends with the
    stop string, or runs a few characters past it when the last token spans past the stop string's end (the stop
    `"</answer>"` completed by a token `">\n"`). `logprobs` align with `token_ids`. The EOS token is never included.

    Logprobs are the log-softmax of the distribution actually sampled from (logits divided by the temperature, top-p
    = 1). With temperature 0 (greedy) they are the log-softmax of the raw logits.
    """

    _tokenizer: Any
    _eos_ids: frozenset[int]
    _max_context: int | None

    def __init__(self) -> None:
        # Reentrant: a pinned request holds it across `load_adapter`/`unload_adapter` and `_generate_locked`, which
        # take it again themselves (module docstring).
        self._lock = threading.RLock()
        self._closed = False

    @property
    def policy_version(self) -> str:
        """The version that will serve the next request: the adapter's version, or the base version."""
        raise NotImplementedError

    @property
    def tokenizer(self) -> Any:
        """The Hugging Face tokenizer (read-only use)."""
        return self._tokenizer

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Token ids that end generation (never included in a Generation)."""
        return self._eos_ids

    @property
    def busy(self) -> bool:
        """True while a request or an adapter swap holds the model.

        An `RLock` has no `locked()` before Python 3.14, so this tries to take it without waiting. Asked from the
        thread that holds it, it reads False (the lock is reentrant); callers ask from the event loop while a worker
        thread holds it.
        """
        if self._lock.acquire(blocking=False):
            self._lock.release()
            return False
        return True

    async def render_prompt(self, messages: Sequence[ChatMessage]) -> PromptContext:
        """Apply the model's chat template with the assistant generation prompt and tokenize the result.

        Pass a system message: without one, SmolLM2's template injects its own default system prompt.
        """
        if not messages:
            raise ValueError("render_prompt needs at least one message")
        chat = [{"role": m.role, "content": m.content} for m in messages]
        text = self._tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        ids = self._tokenizer(text, add_special_tokens=False)["input_ids"]
        return PromptContext(text=text, token_ids=tuple(int(i) for i in ids))

    async def tokenize(self, text: str) -> tuple[int, ...]:
        """Tokenize inserted text without adding special tokens (no BOS/EOS)."""
        if not text:
            return ()
        return tuple(int(i) for i in self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, token_ids: Sequence[int]) -> str:
        """Decode token ids, keeping special tokens (the inverse used for `Generation.text`)."""
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=False)

    async def generate(self, context: PromptContext, *, stop: Sequence[str], max_tokens: int, temperature: float,
                       seed: int | None = None, served: Served | None = None) -> Generation:
        """Sample a continuation of `context.token_ids` until a stop string, EOS or `max_tokens`.

        Args:
            context: the prompt; its token ids are used (its text only when it has no ids).
            stop: stop strings (any number, each non-empty).
            max_tokens: at most this many new tokens (clamped to what fits the context window).
            temperature: 0 for greedy decoding, else the sampling temperature (top-p = 1, no top-k).
            seed: sampling seed; the same seed, prompt and weights give the same continuation.
            served: the version this request must be answered by (one session's pin on a shared client). Holding the
                model lock for the whole call, the worker first loads `served.adapter` as `served.version` (or goes
                back to the base weights when it is None) unless that version is already loaded, then generates;
                the adapter stays loaded afterwards. None: whatever version is loaded.

        Raises:
            ValueError: bad arguments. ContextTooLong: the prompt fills the model's context window.
            PolicyUnavailable: the client was closed.
            AdapterLoadError: `served.adapter` could not be loaded; nothing was generated and the weights loaded
                before the call still serve.
        """
        prompt, stops, max_tokens = await self._prepare(context, stop, max_tokens, temperature)
        if served is None:
            return await asyncio.to_thread(self._generate_locked, prompt, stops, max_tokens, float(temperature), seed)
        return await asyncio.to_thread(self._generate_served, served, prompt, stops, max_tokens, float(temperature),
                                       seed)

    async def generate_group(self, context: PromptContext, n: int, *, stop: Sequence[str], max_tokens: int,
                             temperature: float, seeds: Sequence[int | None] | None = None) -> list[Generation]:
        """`n` continuations of one prompt (a GRPO group, reflection candidates), prefilled once; row i is what
        `generate(context, ..., seed=seeds[i])` returns. The whole group holds the model lock, so every row has the
        same `policy_version`. How the rows are decoded is the engine's (`_group_locked`).

        Args:
            context: the prompt shared by every row.
            n: number of rows (>= 1).
            stop, max_tokens, temperature: as in `generate`, for every row.
            seeds: one seed per row (None entries, or no list, draw random seeds).

        Returns:
            `n` Generations, in row order.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an int >= 1, not {n!r}")
        row_seeds = tuple(seeds) if seeds is not None else (None,) * n
        if len(row_seeds) != n:
            raise ValueError(f"{len(row_seeds)} seeds given for {n} rows")
        prompt, stops, max_tokens = await self._prepare(context, stop, max_tokens, temperature)
        return await asyncio.to_thread(self._group_locked, prompt, stops, max_tokens, float(temperature), row_seeds)

    async def score(self, context: PromptContext, token_ids: Sequence[int], *,
                    temperature: float = 1.0) -> tuple[float, ...]:
        """Log-probabilities the current weights give each of `token_ids` as a continuation of `context`, with the
        sampler's temperature rule (0 means the raw logits). The session's KV cache is not reused for it."""
        prompt = tuple(int(i) for i in context.token_ids) or await self.tokenize(context.text)
        cont = tuple(int(i) for i in token_ids)
        if not prompt:
            raise ValueError("score needs a non-empty prompt")
        if not math.isfinite(temperature) or temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, not {temperature!r}")
        if not cont:
            return ()
        if self._max_context is not None and len(prompt) + len(cont) > self._max_context:
            raise ContextTooLong(f"{len(prompt) + len(cont)} tokens exceed the context window of {self._max_context}")
        return await asyncio.to_thread(self._score_locked, prompt, cont, float(temperature))

    async def aclose(self) -> None:
        """Free the engine's state after a request in progress; later requests raise PolicyUnavailable."""
        await asyncio.to_thread(self._close_locked)

    def load_adapter(self, path: Path | str, version: str) -> None:
        raise NotImplementedError

    def unload_adapter(self) -> None:
        raise NotImplementedError

    async def aload_adapter(self, path: Path | str, version: str) -> None:
        """`load_adapter` without blocking the event loop."""
        await asyncio.to_thread(self.load_adapter, path, version)

    async def aunload_adapter(self) -> None:
        """`unload_adapter` without blocking the event loop."""
        await asyncio.to_thread(self.unload_adapter)

    def finish(self, ids: list[int], logprobs: list[float], reason: str, stop: str | None,
               version: str) -> Generation:
        """The Generation of a finished row (`sampling.Row`): `text` is always `decode(token_ids)`."""
        return Generation(text=self.decode(ids), token_ids=tuple(ids), logprobs=tuple(logprobs),
                          finish_reason=reason, stop=stop, policy_version=version,  # type: ignore[arg-type]
                          token_source="server")

    def _generate_served(self, served: Served, prompt: tuple[int, ...], stops: tuple[str, ...], max_tokens: int,
                         temperature: float, seed: int | None) -> Generation:
        """`_generate_locked` on `served`'s version, with the swap and the generation under one hold of the lock,
        so that no other request runs between them (another session's swap would put its adapter under our tokens).
        """
        with self._lock:
            self._check_open()
            if served.version != self.policy_version:
                if served.adapter is None:
                    self.unload_adapter()
                else:
                    self.load_adapter(served.adapter, served.version)  # AdapterLoadError: the old weights stay
            return self._generate_locked(prompt, stops, max_tokens, temperature, seed)

    # -- what each engine implements -----------------------------------------------------------------------------

    def _generate_locked(self, prompt: tuple[int, ...], stops: tuple[str, ...], max_tokens: int,
                         temperature: float, seed: int | None) -> Generation:
        raise NotImplementedError

    def _group_locked(self, prompt: tuple[int, ...], stops: tuple[str, ...], max_tokens: int, temperature: float,
                      seeds: tuple[int | None, ...]) -> list[Generation]:
        raise NotImplementedError

    def _score_locked(self, prompt: tuple[int, ...], cont: tuple[int, ...], temperature: float) -> tuple[float, ...]:
        raise NotImplementedError

    def _close_locked(self) -> None:
        """Mark the client closed and free the engine's state, after a request in progress (it holds the lock)."""
        with self._lock:
            self._closed = True
            self._release()

    def _release(self) -> None:
        """Free what the engine holds for requests (called once, holding the lock, as the client closes)."""
        raise NotImplementedError

    def _check_open(self) -> None:
        """Call holding the lock: a closed client serves nothing."""
        if self._closed:
            raise PolicyUnavailable("the embedded policy client is closed")

    async def _prepare(self, context: PromptContext, stop: Sequence[str], max_tokens: int,
                       temperature: float) -> tuple[tuple[int, ...], tuple[str, ...], int]:
        """Checked arguments: the prompt's token ids, the stop strings, and `max_tokens` clamped to the window."""
        stops = check_generate_args(stop, max_tokens, temperature)
        prompt = tuple(int(i) for i in context.token_ids) or await self.tokenize(context.text)
        if not prompt:
            raise ValueError("generate needs a non-empty prompt (context has neither token ids nor text)")
        if self._max_context is not None:
            room = self._max_context - len(prompt)
            if room <= 0:
                raise ContextTooLong(f"prompt has {len(prompt)} tokens; the model's context window is "
                                     f"{self._max_context}")
            max_tokens = min(max_tokens, room)
        return prompt, stops, max_tokens


def read_adapter_config(path: Path) -> Any:
    """Validate an adapter folder before touching the model, so a bad path changes nothing."""
    if not path.is_dir():
        raise AdapterLoadError(f"adapter folder not found: {path}")
    if not (path / "adapter_config.json").is_file():
        raise AdapterLoadError(f"{path} has no adapter_config.json; is it a PEFT adapter folder?")
    if not any((path / f).is_file() for f in ("adapter_model.safetensors", "adapter_model.bin")):
        raise AdapterLoadError(f"{path} has no adapter_model.safetensors")
    check_safetensors(path / "adapter_model.safetensors")
    from peft import PeftConfig

    try:
        config = PeftConfig.from_pretrained(str(path))
    except Exception as exc:
        raise AdapterLoadError(f"unreadable adapter config in {path}: {exc}") from exc
    if getattr(config, "peft_type", None) is None or str(config.peft_type).split(".")[-1].upper() != "LORA":
        raise AdapterLoadError(f"{path} holds a {config.peft_type} adapter; only LoRA is supported")
    config.inference_mode = True
    return config


def check_safetensors(weights: Path) -> None:
    """Refuse a truncated or corrupt safetensors file (when there is one) by its name, before any engine reads it.

    Why here: a file cut short (a copy or a save that stopped half-way) was found only inside PEFT's load, after it
    had put LoRA layers into the model (the base model was then loaded again to undo them), or inside the GGUF
    conversion, and the error named neither the file nor what was wrong with it ("incomplete metadata, file not fully
    covered"). Opening it reads only the header, which safetensors checks against the file's size (milliseconds).
    """
    if not weights.is_file():
        return
    from safetensors import safe_open

    try:
        with safe_open(str(weights), framework="pt") as fh:
            fh.keys()
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for a corrupt file
        raise AdapterLoadError(f"{weights} is not a readable safetensors file (truncated or corrupt?): {exc}") from exc
