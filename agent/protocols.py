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


@dataclass(frozen=True, slots=True)
class Served:
    """Which policy version serves one session's requests on a client that several sessions share (issue 49).

    Why it exists: the shared client's own "current version" (`set_model`, `aload_adapter`) is global, so a session
    of team "law" and one of team "bio" running at once could each end up on the other's adapter. A session carries
    its `Served` instead, and every generate call is pinned to it (`agent.policy.PinnedPolicy`). The three names are
    kept apart because the two kinds of client address a version differently.
    """

    version: str  # registry version name recorded on the session: "base", "policy@3", "team:law@2"
    model: str  # the name an HTTP server is sent as `model` (vLLM: the LoRA adapter's name, or the base's served name)
    adapter: str | None  # in-process engines: the adapter folder loaded before the request; None = the base weights

    def __post_init__(self) -> None:
        """Refuse empty names here, where the pin is made, not later as a server's 404 in the middle of a session."""
        if not self.version or not self.model:
            raise ValueError(f"a served version needs a non-empty version and model name, not {self!r}")
        if self.adapter is not None and not self.adapter:
            raise ValueError("adapter must be a folder or None (the base weights), not an empty string")


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
class SharedPolicyClient(PolicyClient, Protocol):
    """A `PolicyClient` several sessions can share, each pinned to its own version per call (`Served`).

    The HTTP clients, `ReplicaSet` and the embedded engines implement it; a `PinnedPolicy` wraps one.
    """

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
        """As `PolicyClient.generate`; with `served`, this one request is answered by that version whatever the
        client's current version is. HTTP clients keep their current alias; an in-process engine swaps its adapter
        under its model lock and leaves `served`'s loaded (its `policy_version` says so), so on a shared engine every
        session should be pinned: an unpinned call gets whichever version ran last."""
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
