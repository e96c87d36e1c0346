"""Typed records shared by every layer: the contract between agent, store and learning.

A research session produces ONE contiguous assistant token sequence (RubricEM trains it that way). Every piece of that
sequence is recorded as a frozen `Turn` at the moment it is produced; stage spans and loss masks are *functions* of
the turns, so they can never drift out of sync with what was sampled.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

Stage = Literal["plan", "research", "review", "answer"]
STAGES: tuple[Stage, ...] = ("plan", "research", "review", "answer")

TurnKind = Literal["sampled", "forced", "tool_output"]
"""sampled: produced by the policy (trainable). forced: a tag the graph inserted itself. tool_output: context."""

TokenSource = Literal["server", "tokenizer", "retokenized"]
"""Where a turn's token ids came from.

server: returned by the policy server with the sample (vLLM `return_token_ids`, in-process generation) - exact.
tokenizer: inserted text (forced tags, tool output) tokenized with the policy's tokenizer - exact by construction.
retokenized: the server returned text only (llama.cpp), so the client tokenized the sampled text - approximate; the
trainer must not treat these ids as the sampled ones.
"""

SessionStatus = Literal["running", "completed", "failed"]
# Where a session came from: the research chat, `rubricem ask`, batch reports, a direct `ResearchService` caller,
# a benchmark run, a promotion-gate probe, or a training rollout (kept in its run's own log).
SessionSource = Literal["chat", "cli", "batch", "api", "eval", "probe", "rollout"]
# Sources the product never learns from and never lists as a user's history: their sessions are created with the
# training opt-out set, so no judge run, retraining window or reflection picks them up.
UNLEARNED_SOURCES: frozenset[str] = frozenset({"eval", "probe"})
# Sources a user's history lists (the research chat's sidebar).
HISTORY_SOURCES: tuple[str, ...] = ("chat", "cli", "batch", "api")
FinishReason = Literal["stop", "length", "abort", "error"]


def sha256_text(text: str) -> str:
    """Hex SHA-256 of a UTF-8 string (prompt hashes, question hashes)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class Turn:
    """One contiguous piece of the single assistant token sequence."""

    stage: Stage
    kind: TurnKind
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] = ()  # sampled turns: one per token id when the server returns them; else empty
    policy_version: str = "base"  # the adapter that produced it, e.g. "policy@17"; inserted text carries it too
    prompt_sha: str = ""  # hash of the prompt templates in force when the turn was made
    token_source: TokenSource = "server"
    finish_reason: FinishReason | None = None  # sampled turns only
    # Sampled turns: the context tokens the policy call read (prompt plus every earlier turn), what an API bills as
    # prompt tokens. None for inserted text, and for turns logged before it was recorded (migration 0012).
    prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.logprobs and len(self.logprobs) != len(self.token_ids):
            raise ValueError(
                f"turn has {len(self.token_ids)} token ids but {len(self.logprobs)} logprobs; they must align"
            )
        if self.prompt_tokens is not None and (self.kind != "sampled" or self.prompt_tokens < 0):
            raise ValueError(f"prompt_tokens is a count >= 0 of a sampled turn, got {self.prompt_tokens!r} on a "
                             f"{self.kind} turn")

    @property
    def trainable(self) -> bool:
        """Only tokens the policy sampled get gradient (METHOD D6)."""
        return self.kind == "sampled"

    @property
    def mask(self) -> tuple[int, ...]:
        """Per-token trainable mask: 1 for sampled tokens, 0 for tool output and forced tags."""
        return (1 if self.trainable else 0,) * len(self.token_ids)


@dataclass(frozen=True, slots=True)
class Snippet:
    """One retrieved item a tool returned; `id` is what `<cite id=...>` refers to (DR Tulu `{call}-{index}`)."""

    id: str
    tool: str
    title: str
    text: str
    url: str = ""


@dataclass(frozen=True, slots=True)
class ToolCallRecord:
    """One executed (or refused) tool call and what came back."""

    tool: str
    query: str
    attrs: Mapping[str, str] = field(default_factory=dict)
    snippets: tuple[Snippet, ...] = ()
    error: str | None = None  # a tool failure the model saw as text; None on success
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class PromptRecord:
    """The rendered prompt (system + user message through the chat template) that precedes the assistant turns."""

    text: str
    token_ids: tuple[int, ...]
    prompt_sha: str


@dataclass(frozen=True, slots=True)
class Trajectory:
    """A whole research session as the policy saw and produced it."""

    session_id: str
    question: str
    prompt: PromptRecord
    turns: tuple[Turn, ...]
    tool_calls: tuple[ToolCallRecord, ...] = ()
    malformed: bool = False  # a required stage is missing even after the forced-prefix retry (METHOD D7)
    max_consecutive_tool_errors: int = 0
    injected_bank_items: tuple[str, ...] = ()  # rubric-bank item ids put into the prompt, in prompt order

    @property
    def assistant_text(self) -> str:
        """The concatenated assistant sequence as text."""
        return "".join(t.text for t in self.turns)

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The concatenated assistant token ids."""
        return tuple(i for t in self.turns for i in t.token_ids)

    @property
    def snippets(self) -> dict[str, Snippet]:
        """Every snippet retrieved in this session, by id."""
        return {s.id: s for call in self.tool_calls for s in call.snippets}

    @property
    def stages_present(self) -> frozenset[Stage]:
        """Stages that have at least one sampled turn."""
        return frozenset(t.stage for t in self.turns if t.kind == "sampled")


def stage_spans(turns: tuple[Turn, ...] | list[Turn]) -> dict[Stage, tuple[range, ...]]:
    """Token ranges of each stage in the assistant sequence, derived from the recorded turns (never re-parsed).

    Adjacent turns of the same stage merge into one range. Every stage key is present (possibly empty).
    """
    spans: dict[Stage, list[range]] = {s: [] for s in STAGES}
    pos = 0
    for turn in turns:
        n = len(turn.token_ids)
        if n:
            ranges = spans[turn.stage]
            if ranges and ranges[-1].stop == pos:
                ranges[-1] = range(ranges[-1].start, pos + n)
            else:
                ranges.append(range(pos, pos + n))
        pos += n
    return {s: tuple(r) for s, r in spans.items()}


def loss_mask(turns: tuple[Turn, ...] | list[Turn]) -> tuple[int, ...]:
    """Per-token trainable mask over the whole assistant sequence."""
    return tuple(m for t in turns for m in t.mask)


def token_stages(turns: tuple[Turn, ...] | list[Turn]) -> tuple[int, ...]:
    """Per-token stage index (0..3), or -1 for tokens without gradient (tool output, forced tags)."""
    out: list[int] = []
    for t in turns:
        out.extend([STAGES.index(t.stage) if t.trainable else -1] * len(t.token_ids))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """A row of the session log together with its trajectory, as read back."""

    session_id: str
    question: str
    status: SessionStatus
    created_at: str
    finished_at: str | None
    policy_version: str
    options: Mapping[str, object]
    trajectory: Trajectory
    report: str | None = None
    error: str | None = None
    metrics: Mapping[str, object] = field(default_factory=dict)
    source: SessionSource = "api"
    training_opt_out: bool = False
    owner: str = "local"  # who asked: an account name, an OIDC e-mail or subject, or "local"
    policy_model: str | None = None  # the served model's name ("embedded" in-process); None before migration 0012
    team: str | None = None  # the owner's team when it started (migration 0013, issue 49); None: the global policy


def normalise_question(question: str) -> str:
    """Lower-case, whitespace-collapsed question: the key under which attempts at "the same question" meet."""
    return " ".join(question.lower().split())


def question_sha(question: str) -> str:
    """SHA-256 of the normalised question (rubric-bank within-episode key; the judge's rubric-buffer key)."""
    return sha256_text(normalise_question(question))


RetrievalMode = Literal["within", "cross", "none"]


@dataclass(frozen=True, slots=True)
class BankItem:
    """One rubric-bank item: the accepted reflection on one judged trajectory (METHOD §7.1)."""

    id: str
    question: str
    question_sha: str
    rubrics: str  # inner text of <reflection_rubrics>
    takeaways: str  # inner text of <reflection_takeaways>
    score: float  # the reflection judge's u in [0, 1]
    judge_model: str
    policy_version: str
    session_id: str
    created_at: str  # ISO-8601 UTC

    @classmethod
    def new(
        cls,
        *,
        question: str,
        rubrics: str,
        takeaways: str,
        score: float,
        judge_model: str,
        policy_version: str,
        session_id: str,
        created_at: str | None = None,
    ) -> BankItem:
        """A fresh item with a random id, the question's hash and the current time."""
        return cls(
            id=f"bank-{uuid.uuid4().hex[:16]}",
            question=question.strip(),
            question_sha=question_sha(question),
            rubrics=rubrics.strip(),
            takeaways=takeaways.strip(),
            score=float(score),
            judge_model=judge_model,
            policy_version=policy_version,
            session_id=session_id,
            created_at=created_at or datetime.now(UTC).isoformat(timespec="microseconds"),
        )


@dataclass(frozen=True, slots=True)
class BankHit:
    """A retrieved item and its cosine similarity to the query (1.0 for a within-episode match)."""

    item: BankItem
    similarity: float


@dataclass(frozen=True, slots=True)
class Retrieval:
    """What the bank returned for a question: within-episode (same question), cross-episode (similar ones), none."""

    mode: RetrievalMode
    hits: tuple[BankHit, ...] = ()

    @property
    def item_ids(self) -> tuple[str, ...]:
        """Ids of the retrieved items, in prompt order."""
        return tuple(h.item.id for h in self.hits)
