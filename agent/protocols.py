"""Protocols at the agent's boundaries: the policy it samples from, the tools it calls and the rubric bank it reads.

Real adapters live in `agent/policy/`, `agent/tools/` and (for the in-process torch backend) `learning/`;
test doubles live only in `tests/fakes.py`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from store.records import FinishReason, Retrieval, Snippet, TokenSource


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One chat message before templating."""

    role: str  # "system" | "user" | "assistant"
    content: str


@dataclass(frozen=True, slots=True)
class PromptContext:
    """What a generation continues from: the templated prompt plus every earlier assistant turn.

    Both forms are kept because servers differ: vLLM takes token ids, the llama.cpp server only text.
    """

    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Generation:
    """One sampled continuation, normalised across servers.

    `text` is exactly what `token_ids` spell (an EOS id is never included). `stop` names the stop string that ended
    the generation (None for EOS/length). vLLM and the in-process backend keep the tokens that spelled the stop string,
    so the sampled closing tag is trained (METHOD.md D6): `text` contains it at its end, possibly followed by a few
    characters when the last token runs past the stop string. The llama.cpp server drops the stop string, so `text`
    excludes it. The graph appends the closing tag as a forced (masked) turn when it is not near the end of `text`
    (STYLE.md §3).
    """

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    stop: str | None
    policy_version: str
    token_source: TokenSource = "server"


@runtime_checkable
class PolicyClient(Protocol):
    """A policy the agent can sample from (vLLM, llama.cpp server, in-process transformers)."""

    @property
    def policy_version(self) -> str:
        """The version that will serve the next request (e.g. "base", "policy@3")."""
        ...

    async def render_prompt(self, messages: Sequence[ChatMessage]) -> PromptContext:
        """Apply the chat template (with the assistant generation prompt) and tokenize."""
        ...

    async def tokenize(self, text: str) -> tuple[int, ...]:
        """Tokenize inserted text (forced tags, tool output) without special tokens."""
        ...

    async def generate(
        self,
        context: PromptContext,
        *,
        stop: Sequence[str],
        max_tokens: int,
        temperature: float,
        seed: int | None = None,
    ) -> Generation:
        """Sample a continuation of `context` until a stop string, EOS or `max_tokens`."""
        ...

    async def aclose(self) -> None:
        """Release connections/resources."""
        ...


@runtime_checkable
class SearchTool(Protocol):
    """A tool the model may call with `<call_tool name="...">argument</call_tool>`."""

    name: str
    description: str  # one line shown in the system prompt

    async def __call__(self, query: str, attrs: Mapping[str, str], call_id: str) -> Sequence[Snippet]:
        """Run the tool. Snippet ids must be `{call_id}-{index}`. Raise ToolError on failure."""
        ...


@runtime_checkable
class ReflectionBank(Protocol):
    """The rubric bank as the agent side sees it (store.rubric_bank.RubricBank implements it)."""

    def retrieve(self, question: str, *, mode: Literal["auto", "within", "cross"] = "auto") -> Retrieval:
        """Within-episode item for this exact question, else (or only, per `mode`) similar questions' items."""
        ...
