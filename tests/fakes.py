"""Test doubles for boundaries that cannot run here, and for scripting exact model outputs.

`ScriptedPolicy` stands in for the policy *server*: a plain function decides what the "model" says next, and a
byte-level tokenizer makes token ids exact (1 token per UTF-8 byte), so masks and spans can be checked precisely.
It applies the same stop/length semantics as the real servers (`keep_stop=True` like vLLM, False like llama.cpp).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from agent.protocols import ChatMessage, Generation, PromptContext

Script = Callable[[str, Sequence[str]], str]  # (context text so far, stop strings) -> raw model output


def byte_ids(text: str) -> tuple[int, ...]:
    """The byte tokenizer: one id per UTF-8 byte."""
    return tuple(text.encode("utf-8"))


@dataclass
class ScriptedPolicy:
    """A PolicyClient whose outputs come from `script`; records every call it gets."""

    script: Script
    keep_stop: bool = True
    version: str = "scripted@0"
    calls: list[dict[str, object]] = field(default_factory=list)

    @property
    def policy_version(self) -> str:  # noqa: D102
        return self.version

    async def render_prompt(self, messages: Sequence[ChatMessage]) -> PromptContext:  # noqa: D102
        text = "".join(f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in messages) + "<|im_start|>assistant\n"
        return PromptContext(text, byte_ids(text))

    async def tokenize(self, text: str) -> tuple[int, ...]:  # noqa: D102
        return byte_ids(text)

    async def generate(  # noqa: D102
        self, context: PromptContext, *, stop: Sequence[str], max_tokens: int, temperature: float,
        seed: int | None = None,
    ) -> Generation:
        assert context.token_ids == byte_ids(context.text), "context text and ids drifted apart"
        raw = self.script(context.text, stop)
        self.calls.append({"stop": list(stop), "max_tokens": max_tokens, "context_len": len(context.token_ids)})
        hits = [(raw.find(s), s) for s in stop if s and s in raw]
        matched = min(hits)[1] if hits else None
        text = raw[: raw.find(matched) + (len(matched) if self.keep_stop else 0)] if matched else raw
        ids = byte_ids(text)
        finish = "stop"
        if len(ids) > max_tokens:
            # Cut at a character boundary so that text and ids stay exact inverses.
            text = bytes(ids[:max_tokens]).decode("utf-8", errors="ignore")
            ids, matched, finish = byte_ids(text), None, "length"
        return Generation(
            text=text,
            token_ids=ids,
            logprobs=tuple(-math.log(2.0) for _ in ids),
            finish_reason=finish,
            stop=matched,
            policy_version=self.version,
        )

    async def aclose(self) -> None:  # noqa: D102
        pass
