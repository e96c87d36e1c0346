"""Typed results of judging, shared by the LLM judge, the offline judge, the CLI, the trainer and the store.

Every judgement is a pydantic model because it crosses an I/O edge (judge JSON in, the store's JSON payload out).
Failure semantics (METHOD §5.2 C.4, C9): an unscorable stage has `score=None`, counted in `failed_stages`, never a
silent 0; if every stage failed, `fallback_answer_only` is set and only the Answer score is used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from store.records import STAGES, Stage, Trajectory

Polarity = Literal["positive", "negative"]
JudgeKind = Literal["llm", "offline"]


class Rubric(BaseModel):
    """One rubric item for one stage. Weight 1 = minor, 2 = important, 3 = critical (METHOD §5.2)."""

    model_config = ConfigDict(frozen=True)

    id: str  # stable within a question's buffer (e.g. "s4-p-3" or a hash of stage+title)
    stage: Stage
    title: str
    description: str
    weight: int = Field(ge=1, le=3)
    polarity: Polarity = "positive"
    persistent: bool = False  # given with the question; never pruned; Answer stage only


class RubricScore(BaseModel):
    """The judge's score of one rubric on one trajectory: 0/1/2, or None if it could not be scored."""

    model_config = ConfigDict(frozen=True)

    rubric_id: str
    score: int | None = Field(default=None, ge=0, le=2)
    justification: str = ""


class StageResult(BaseModel):
    """R_k of one stage (METHOD D3) with the per-rubric scores behind it."""

    model_config = ConfigDict(frozen=True)

    stage: Stage
    score: float | None = Field(default=None, ge=0.0, le=1.0)  # None = failed/unscorable, never a silent 0
    rubric_scores: tuple[RubricScore, ...] = ()
    error: str | None = None


class CitationCheck(BaseModel):
    """How many cited ids exist among the trajectory's retrieved snippets (and, optionally, support a claim)."""

    model_config = ConfigDict(frozen=True)

    cited: int = 0
    valid: int = 0
    precision: float | None = None  # valid / cited; None when nothing was cited
    support_checked: int = 0
    supported: int = 0


class Usage(BaseModel):
    """Token and cost accounting of judge calls."""

    model_config = ConfigDict(frozen=True)

    calls: int = 0
    cached_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            calls=self.calls + other.calls,
            cached_calls=self.cached_calls + other.cached_calls,
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
        )


class Judgement(BaseModel):
    """The judgement of one trajectory: what the trainer and the store need."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    question: str
    stages: dict[Stage, StageResult]
    citations: CitationCheck = CitationCheck()
    scaffold: dict[str, Any] = Field(default_factory=dict)  # e.g. {"stages_present": [...], "malformed": False}
    judge_model: str
    judge_kind: JudgeKind
    approximate: bool = False  # True for the offline judge: an embedding-similarity estimate, not a real grade
    rubric_version: str = ""
    prompt_version: str = ""
    failed_stages: int = 0
    fallback_answer_only: bool = False
    usage: Usage = Usage()
    # What a judge with the verifiable option added to the Answer score (learning/judge/verifiable.py): the weight,
    # the terms, and the Answer score before and after, or why nothing was added; None when the option is off.
    verifiable: dict[str, Any] | None = None

    def stage_scores(self) -> dict[Stage, float | None]:
        """R_k per stage, with the answer-only fallback applied when every stage failed."""
        return {s: (self.stages[s].score if s in self.stages else None) for s in STAGES}


class ReflectionScore(BaseModel):
    """The reflection judge's scores of one candidate (METHOD §6.4, D8)."""

    model_config = ConfigDict(frozen=True)

    candidate: int
    valid: bool  # has exactly the two required blocks
    diagnostic_accuracy: float | None = Field(default=None, ge=0.0, le=1.0)
    specificity: float | None = Field(default=None, ge=0.0, le=1.0)
    scope_balance: float | None = Field(default=None, ge=0.0, le=1.0)
    u_within: float | None = None
    u_cross: float | None = None
    u: float | None = None  # ½(u_within + u_cross); None when invalid or unscorable
    justification: str = ""
    error: str | None = None


class JudgeCall(BaseModel):
    """One structured judge call's parsed (and validated) result."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    data: Any
    model: str
    cached: bool = False
    repaired: bool = False  # the first answer was invalid and the repair retry fixed it
    usage: Usage = Usage()


class JsonJudge(Protocol):
    """An endpoint that answers chat messages with JSON of a given schema (learning/judge/client.py)."""

    model: str

    async def complete_json(
        self,
        messages: Sequence[Mapping[str, str]],
        schema: Mapping[str, Any],
        *,
        name: str,
        validate: Any = None,  # Callable[[Any], T]: raises on a wrong shape (e.g. a pydantic model_validate)
        max_tokens: int | None = None,
        temperature: float = 0.0,
    ) -> JudgeCall:
        """Ask, parse strictly, validate; one repair retry on invalid output. Raises JudgeError subclasses."""
        ...


class RubricBufferStore(Protocol):
    """Where per-question rubric buffers persist (store.session_log.SessionLog implements it)."""

    def deletion_epoch(self) -> int:
        """How many data deletions the store has recorded (read before the data a buffer is made from)."""
        ...

    def save_rubric_buffer(self, question_sha: str, question: str, payload: Mapping[str, object], *,
                           deletions_seen: int | None = None) -> int:
        """Save; returns the new version. Raises store.errors.DeletedMeanwhile (nothing written) when a deletion was
        recorded since `deletions_seen`."""
        ...

    def load_rubric_buffer(self, question_sha: str) -> tuple[dict[str, Any], int] | None:
        """The saved payload and version, or None."""
        ...


class TrajectoryJudge(Protocol):
    """Judges a group of trajectories of the same question (LLM or offline backend)."""

    kind: JudgeKind
    model: str

    async def judge_group(
        self, question: str, trajectories: Sequence[Trajectory], persistent: Sequence[Rubric] = (), *,
        session_rubrics: Sequence[Rubric] = (), deletions_seen: int | None = None,
    ) -> list[Judgement]:
        """One Judgement per trajectory, in order. Never raises for a bad judge answer: failures are recorded in
        the Judgement (None scores, `failed_stages`, fallback); raises JudgeUnavailable only if nothing could be
        judged at all.

        `persistent` rubrics join the question's buffer (every later judgement of the question uses them);
        `session_rubrics` (a user's approved plan rubric, issue 21) are Answer-stage rubrics for THIS group only:
        scored like persistent ones, never saved in the buffer, so no other session of the question meets them.
        `deletions_seen`: the store's `deletion_epoch()` read before the trajectories were (None: read it when the
        buffer is loaded); a deletion recorded since then keeps the buffer from being saved (issue 46)."""
        ...
