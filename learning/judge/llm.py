"""The stagewise evolving-rubric LLM judge (METHOD §5.2): generate rubrics from a group, score each trajectory, prune.

Two levels (STYLE C9): `generate_rubrics` and `score_trajectory` make one judge call each; `score_group` /
`judge_group` run the whole round (load buffer → generate → add → score concurrently → aggregate R_k → prune → save)
and return new objects, never mutating their inputs. A bad or missing judge answer is `None`, counted, never 0.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from learning.errors import JudgeError, JudgeOutputInvalid, JudgeRequestError, JudgeUnavailable
from learning.judge.aggregate import answer_only_fallback, stage_score
from learning.judge.buffer import (
    PruneResult,
    RubricBuffer,
    load_buffer,
    question_sha,
    rubric_id,
    save_unless_deleted,
)
from learning.judge.citations import check_citations, support_check
from learning.judge.types import (
    CitationCheck,
    JsonJudge,
    JudgeKind,
    Judgement,
    Rubric,
    RubricBufferStore,
    RubricScore,
    StageResult,
    Usage,
)
from learning.prompts import messages, prompt_version
from store.records import STAGES, Stage, Trajectory, normalise_question

STAGE_KEYS: Mapping[str, Stage] = {"stage_1": "plan", "stage_2": "research", "stage_3": "review", "stage_4": "answer"}
STAGE_NAMES: Mapping[Stage, str] = {"plan": "Plan", "research": "Research", "review": "Review", "answer": "Answer"}
MAX_NEW_PER_STAGE = 6  # a generous bound over the prompt's targets (1-4, 2-5); the buffer caps do the real limiting
TITLE_CHARS = 200
DESCRIPTION_CHARS = 1000
TOOL_OUTPUT_CHARS = 600  # each <tool_output> is cut to this in judge prompts: the judge needs its gist, not its bulk
ABSENT_NOTE = "stage absent from the trajectory (METHOD D7): R = 0"
NO_RUBRICS_NOTE = "no rubrics for this stage yet (METHOD open point 9): unscored"

Failure = Literal["invalid", "unavailable", "rejected"]


# --- judge JSON shapes ---------------------------------------------------------------------------------------------


class GeneratedItem(BaseModel):
    """One rubric as the generator writes it."""

    model_config = ConfigDict(extra="forbid")

    title: str
    description: str
    weight: Literal[1, 2, 3]


class GeneratedStage(BaseModel):
    """One stage's new rubrics."""

    model_config = ConfigDict(extra="forbid")

    positive_rubrics: list[GeneratedItem]
    negative_rubrics: list[GeneratedItem]


class GenerationAnswer(BaseModel):
    """The rubric generator's answer: keys stage_1 … stage_4 (METHOD §5.2 C.2)."""

    model_config = ConfigDict(extra="forbid")

    stage_1: GeneratedStage
    stage_2: GeneratedStage
    stage_3: GeneratedStage
    stage_4: GeneratedStage


class IndexScore(BaseModel):
    """The score of the rubric numbered `index` (1-based) in the scoring prompt."""

    model_config = ConfigDict(extra="forbid")

    index: int
    score: Literal[0, 1, 2]
    justification: str


class ScoringAnswer(BaseModel):
    """The scorer's answer: one entry per rubric index."""

    model_config = ConfigDict(extra="forbid")

    scores: list[IndexScore]


def scoring_validator(n_rubrics: int) -> Callable[[object], ScoringAnswer]:
    """A `validate` callable for a scoring answer over rubrics numbered 1..n: indices in range, no duplicates.

    Missing indices are allowed (those rubrics stay unscored); an empty list is not.
    """

    def validate(data: object) -> ScoringAnswer:
        answer = ScoringAnswer.model_validate(data)
        if not answer.scores:
            raise ValueError("the scores list is empty")
        seen: set[int] = set()
        for item in answer.scores:
            if not 1 <= item.index <= n_rubrics:
                raise ValueError(f"rubric index {item.index} is out of range 1..{n_rubrics}")
            if item.index in seen:
                raise ValueError(f"rubric index {item.index} is scored twice")
            seen.add(item.index)
        return answer

    return validate


# --- rendering -----------------------------------------------------------------------------------------------------


def _cut(text: str, limit: int) -> str:
    """Cut the middle out of `text` so it fits `limit` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    marker = f"\n[... {len(text) - limit} characters cut ...]\n"
    if limit <= len(marker):
        return text[: max(0, limit)]
    keep = limit - len(marker)
    head = (keep * 3) // 5  # the start of a stage (its intent) and its end (its conclusion) matter most
    return text[:head] + marker + text[len(text) - (keep - head) :]


def _shares(lengths: Sequence[int], budget: int) -> list[int]:
    """Water-filling: short sections keep everything; the budget left is split evenly among the long ones."""
    allowed = [0] * len(lengths)
    pending = sorted(range(len(lengths)), key=lambda i: lengths[i])
    remaining = max(0, budget)
    while pending:
        share = remaining // len(pending)
        first = pending[0]
        if lengths[first] <= share:
            allowed[first] = lengths[first]
            remaining -= lengths[first]
            pending.pop(0)
        else:
            for i in pending:
                allowed[i] = share
            break
    return allowed


def stage_sections(trajectory: Trajectory, tool_output_chars: int = TOOL_OUTPUT_CHARS) -> list[tuple[Stage, str]]:
    """The trajectory as (stage, text) sections, consecutive turns of one stage merged; tool outputs shortened."""
    sections: list[tuple[Stage, list[str]]] = []
    for turn in trajectory.turns:
        text = _cut(turn.text, tool_output_chars) if turn.kind == "tool_output" else turn.text
        if sections and sections[-1][0] == turn.stage:
            sections[-1][1].append(text)
        else:
            sections.append((turn.stage, [text]))
    return [(stage, "".join(parts).strip()) for stage, parts in sections]


def _header(stage: Stage) -> str:
    return f"### Stage {STAGES.index(stage) + 1}: {STAGE_NAMES[stage]}\n"


def render_trajectory(
    trajectory: Trajectory,
    max_chars: int = 12000,
    *,
    stages: Sequence[Stage] = STAGES,
    tool_output_chars: int = TOOL_OUTPUT_CHARS,
) -> str:
    """The trajectory as judge-readable text: a header per stage, then its turns (tool outputs included but cut).

    If the whole is longer than `max_chars`, every long section is cut in its middle so that the result fits:
    short sections stay whole and the long ones share what is left (so a long Research stage cannot crowd out the
    Answer).

    Args:
        trajectory: the session.
        max_chars: the result is at most this long.
        stages: only these stages are shown (e.g. ("answer",) for the answer-only fallback).
        tool_output_chars: each tool output is cut to this first.
    """
    sections = [(s, t) for s, t in stage_sections(trajectory, tool_output_chars) if s in stages]
    if not sections:
        return "(the trajectory has no text for these stages)"[:max_chars]
    headers = [_header(s) for s, _ in sections]
    separators = 2 * (len(sections) - 1)
    budget = max_chars - sum(len(h) for h in headers) - separators
    allowed = _shares([len(t) for _, t in sections], budget)
    parts = [h + _cut(t, a) for h, (_, t), a in zip(headers, sections, allowed, strict=True)]
    return "\n\n".join(parts)[:max_chars]


def render_rubric_line(index: int | None, rubric: Rubric) -> str:
    """`[3] Stage 2 (Research) · negative · weight 2 · Title: description`."""
    number = f"[{index}] " if index is not None else "- "
    stage = f"Stage {STAGES.index(rubric.stage) + 1} ({STAGE_NAMES[rubric.stage]})"
    kind = "persistent " + rubric.polarity if rubric.persistent else rubric.polarity
    return f"{number}{stage} · {kind} · weight {rubric.weight} · {rubric.title}: {rubric.description}"


def _render_existing(buffer: RubricBuffer) -> str:
    rubrics = buffer.all_rubrics()
    return "\n".join(render_rubric_line(None, r) for r in rubrics) if rubrics else "(none yet)"


# --- results -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StageRubrics:
    """New rubrics from one generation call (STYLE C9). `error` set = the call failed: "no new rubrics"."""

    rubrics: tuple[Rubric, ...] = ()
    usage: Usage = field(default_factory=Usage)
    error: str | None = None
    failure: Failure | None = None

    def by_stage(self, stage: Stage) -> tuple[Rubric, ...]:
        """The new rubrics of one stage."""
        return tuple(r for r in self.rubrics if r.stage == stage)


@dataclass(frozen=True, slots=True)
class TrajectoryScores:
    """Per-rubric scores of one trajectory from one scoring call (STYLE C9).

    `scores` has an entry for every rubric asked about; `score=None` where the judge gave nothing usable.
    """

    scores: Mapping[str, RubricScore] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    error: str | None = None
    failure: Failure | None = None
    called: bool = False  # a judge call was made (False when there was nothing to score)

    def score_of(self, rubric_id: str) -> int | None:
        """The raw 0/1/2 score of a rubric, or None."""
        found = self.scores.get(rubric_id)
        return found.score if found is not None else None


@dataclass(frozen=True, slots=True)
class ScoredGroup:
    """The outcome of one judging round for one question (STYLE C9's high-level result).

    Attributes:
        question: the question.
        judgements: one per trajectory, in input order.
        rubrics: every rubric the trajectories were scored against (persistent + active after adding new ones).
        new_rubrics: the rubrics this round's generation added to the buffer.
        buffer: the buffer after pruning, as saved (its `version` is the judgements' `rubric_version`).
        prune: what pruning retired.
        generation_error: why rubric generation failed (then no new rubrics), or None.
        usage: the round's total judge usage (generation + scoring + support checks).
    """

    question: str
    judgements: tuple[Judgement, ...]
    rubrics: tuple[Rubric, ...]
    new_rubrics: tuple[Rubric, ...]
    buffer: RubricBuffer
    prune: PruneResult
    generation_error: str | None
    usage: Usage


def _failure_of(exc: JudgeError) -> Failure:
    if isinstance(exc, JudgeOutputInvalid):
        return "invalid"
    if isinstance(exc, JudgeRequestError):
        return "rejected"
    return "unavailable"


def _describe(exc: JudgeError) -> str:
    return f"{type(exc).__name__}: {exc}"


# --- the judge -----------------------------------------------------------------------------------------------------


class LLMJudge:
    """The stagewise evolving-rubric judge over any `JsonJudge` endpoint (implements `TrajectoryJudge`).

    Buffers persist through `store` (the SessionLog) keyed by the question's hash; without a store they live in this
    object's memory (version "mem-N"). Judge one group per question at a time: two concurrent rounds on the same
    question would each save their own buffer and the later save wins.
    """

    kind: JudgeKind = "llm"

    def __init__(
        self,
        client: JsonJudge,
        store: RubricBufferStore | None = None,
        *,
        trajectory_chars: int = 12000,
        citation_support_check: bool = False,
        tool_output_chars: int = TOOL_OUTPUT_CHARS,
    ) -> None:
        """Set up a judge.

        Args:
            client: the JSON judge endpoint (learning.judge.client.JudgeClient).
            store: where rubric buffers persist; None keeps them in memory.
            trajectory_chars: each trajectory is cut to this many characters in judge prompts.
            citation_support_check: also ask the judge whether each cited claim is supported by its snippets.
            tool_output_chars: each tool output is cut to this many characters first.
        """
        if trajectory_chars < 200:
            raise ValueError(f"trajectory_chars must be at least 200, got {trajectory_chars}")
        self.client = client
        self.model: str = client.model  # the judge model id, as recorded on every Judgement
        self.store = store
        self.trajectory_chars = trajectory_chars
        self.citation_support_check = citation_support_check
        self.tool_output_chars = tool_output_chars
        self._memory: dict[str, RubricBuffer] = {}
        self._memory_saves = 0

    @property
    def prompt_version(self) -> str:
        """Hash of the judge prompts in force."""
        return prompt_version()

    # -- low level ------------------------------------------------------------------------------------------------

    async def generate_rubrics(
        self, question: str, trajectories: Sequence[Trajectory], buffer: RubricBuffer
    ) -> StageRubrics:
        """One generation call: new stagewise rubrics contrasting the group (METHOD §5.2 C.2).

        The generator sees every trajectory (tool outputs cut) and the buffer's persistent and active rubrics, so it
        can avoid repeating them. A failed call returns no rubrics with `error` set (METHOD: "no new rubrics").
        """
        attempts = "\n\n".join(
            f"=== Attempt {i} ===\n"
            + render_trajectory(t, self.trajectory_chars, tool_output_chars=self.tool_output_chars)
            for i, t in enumerate(trajectories, start=1)
        )
        prompt = messages(
            "rubric_generation",
            count=str(len(trajectories)),
            question=question,
            existing_rubrics=_render_existing(buffer),
            trajectories=attempts,
        )
        try:
            call = await self.client.complete_json(
                prompt,
                GenerationAnswer.model_json_schema(),
                name="rubric_generation",
                validate=GenerationAnswer.model_validate,
            )
        except JudgeError as exc:
            return StageRubrics(error=_describe(exc), failure=_failure_of(exc), usage=exc.usage or Usage())
        return StageRubrics(rubrics=self._rubrics_from(call.data), usage=call.usage)

    @staticmethod
    def _rubrics_from(answer: GenerationAnswer) -> tuple[Rubric, ...]:
        out: list[Rubric] = []
        for key, stage in STAGE_KEYS.items():
            block: GeneratedStage = getattr(answer, key)
            items = [(i, "positive") for i in block.positive_rubrics] + [
                (i, "negative") for i in block.negative_rubrics
            ]
            kept = 0
            for item, polarity in items:
                title = " ".join(item.title.split())[:TITLE_CHARS]
                if not title or kept >= MAX_NEW_PER_STAGE:
                    continue
                out.append(
                    Rubric(
                        id=rubric_id(stage, title),
                        stage=stage,
                        title=title,
                        description=item.description.strip()[:DESCRIPTION_CHARS],
                        weight=item.weight,
                        polarity=polarity,  # type: ignore[arg-type]
                    )
                )
                kept += 1
        return tuple(out)

    async def score_trajectory(
        self,
        trajectory: Trajectory,
        rubrics: Sequence[Rubric],
        *,
        stages: Sequence[Stage] = STAGES,
        scope_note: str = "",
    ) -> TrajectoryScores:
        """One scoring call: every given rubric, numbered, against the trajectory (METHOD §5.2 C.3).

        Args:
            trajectory: the session to score.
            rubrics: the rubrics to score (any stages); none means no call.
            stages: the stages of the trajectory shown to the judge.
            scope_note: an extra sentence for the judge (the answer-only fallback uses it).

        Returns:
            Scores for every rubric (None where the judge gave nothing usable), with `error` on a failed call.
        """
        if not rubrics:
            return TrajectoryScores()
        listing = "\n".join(render_rubric_line(i, r) for i, r in enumerate(rubrics, start=1))
        prompt = messages(
            "stage_scoring",
            question=trajectory.question,
            rubrics=listing,
            trajectory=render_trajectory(
                trajectory, self.trajectory_chars, stages=stages, tool_output_chars=self.tool_output_chars
            ),
            scope_note=scope_note,
        )
        try:
            call = await self.client.complete_json(
                prompt,
                ScoringAnswer.model_json_schema(),
                name="stage_scoring",
                validate=scoring_validator(len(rubrics)),
            )
        except JudgeError as exc:
            empty = {r.id: RubricScore(rubric_id=r.id) for r in rubrics}
            return TrajectoryScores(scores=empty, error=_describe(exc), failure=_failure_of(exc), called=True,
                                    usage=exc.usage or Usage())
        answer: ScoringAnswer = call.data
        by_index = {item.index: item for item in answer.scores}
        scores: dict[str, RubricScore] = {}
        for i, r in enumerate(rubrics, start=1):
            item = by_index.get(i)
            scores[r.id] = (
                RubricScore(rubric_id=r.id, score=item.score, justification=item.justification.strip())
                if item is not None
                else RubricScore(rubric_id=r.id, justification="not scored by the judge")
            )
        return TrajectoryScores(scores=scores, usage=call.usage, called=True)

    # -- high level -----------------------------------------------------------------------------------------------

    async def judge_group(
        self, question: str, trajectories: Sequence[Trajectory], persistent: Sequence[Rubric] = (), *,
        session_rubrics: Sequence[Rubric] = (), deletions_seen: int | None = None,
    ) -> list[Judgement]:
        """One Judgement per trajectory, in order (see `score_group`)."""
        return list((await self.score_group(question, trajectories, persistent, session_rubrics=session_rubrics,
                                            deletions_seen=deletions_seen)).judgements)

    async def score_group(
        self, question: str, trajectories: Sequence[Trajectory], persistent: Sequence[Rubric] = (), *,
        session_rubrics: Sequence[Rubric] = (), deletions_seen: int | None = None,
    ) -> ScoredGroup:
        """A whole judging round for one question's group of trajectories.

        Failure semantics (METHOD §5.2 C.4, STYLE C9):
        - generation fails → no new rubrics (`generation_error`, and "rubric_generation" in each judgement's
          scaffold);
        - a scoring call fails or its output is unusable → those stages are None and counted in `failed_stages`;
        - every scored stage None → answer-only fallback: when the failure was a bad answer (not a dead endpoint), one
          more call scores the Answer rubrics on the answer alone, and only that score is kept
          (`fallback_answer_only`);
        - a stage absent from the trajectory gets R = 0 (METHOD D7); a present stage with no rubrics is None;
        - a data deletion recorded since `deletions_seen` (the store's epoch read before the trajectories were; None:
          when the buffer is loaded) wins: the buffer is not saved, and the judgements carry rubric_version "".

        Raises:
            ValueError: a trajectory answers a different question.
            JudgeUnavailable: the endpoint never gave a usable answer because it was down (nothing could be judged).
            JudgeRequestError: the endpoint rejected every request (a configuration problem: model name, key).
        """
        want = normalise_question(question)
        for t in trajectories:
            if normalise_question(t.question) != want:
                raise ValueError(f"session {t.session_id} answers a different question than the group's")
        buffer = (await self._load(question, deletions_seen)).with_persistent(persistent)
        if not trajectories:
            return ScoredGroup(question, (), buffer.all_rubrics(), (), buffer, PruneResult(), None, Usage())

        # Session rubrics (a user's approved plan) are scored with this group only: `scoring` holds them, the buffer
        # that is pruned and saved never does.
        generated = await self.generate_rubrics(question, trajectories, buffer.with_persistent(session_rubrics))
        buffer, added = buffer.add(generated.rubrics)
        scoring = buffer.with_persistent(session_rubrics)

        outcomes = await asyncio.gather(*(self._judge_one(t, scoring) for t in trajectories))
        self._raise_if_nothing_judged(generated, outcomes)

        group_scores: dict[str, list[int | None]] = {}
        for outcome in outcomes:
            for ts in (outcome.main, outcome.fallback):
                for rid, rs in ts.scores.items():
                    group_scores.setdefault(rid, []).append(rs.score)
        scored_rubrics = scoring.all_rubrics()
        buffer, pruned = buffer.prune(group_scores)
        buffer = await self._save(buffer)

        judgements: list[Judgement] = []
        total = generated.usage
        for i, (t, outcome) in enumerate(zip(trajectories, outcomes, strict=True)):
            usage = outcome.usage + (generated.usage if i == 0 else Usage())  # the group's cost sums over its rows
            total = total + outcome.usage
            scaffold = dict(outcome.scaffold)
            scaffold["rubric_generation"] = "ok" if generated.error is None else f"failed: {generated.error}"
            scaffold["new_rubrics"] = len(added)
            judgements.append(
                Judgement(
                    session_id=t.session_id,
                    question=t.question,
                    stages=outcome.stages,
                    citations=outcome.citations,
                    scaffold=scaffold,
                    judge_model=self.model,
                    judge_kind="llm",
                    rubric_version=buffer.version,
                    prompt_version=self.prompt_version,
                    failed_stages=outcome.failed_stages,
                    fallback_answer_only=outcome.fallback_used,
                    usage=usage,
                )
            )
        return ScoredGroup(
            question=question,
            judgements=tuple(judgements),
            rubrics=scored_rubrics,
            new_rubrics=added,
            buffer=buffer,
            prune=pruned,
            generation_error=generated.error,
            usage=total,
        )

    async def _judge_one(self, trajectory: Trajectory, buffer: RubricBuffer) -> _Outcome:
        present = trajectory.stages_present
        judged_stages = [s for s in STAGES if s in present and buffer.stage_rubrics(s)]
        rubrics = [r for s in judged_stages for r in buffer.stage_rubrics(s)]

        support = support_check(self.client, trajectory) if self.citation_support_check else None
        if support is not None:
            main, supported = await asyncio.gather(self.score_trajectory(trajectory, rubrics), support)
            citations, support_usage, support_failed = supported.check, supported.usage, supported.failed
        else:
            main = await self.score_trajectory(trajectory, rubrics)
            citations, support_usage, support_failed = check_citations(trajectory), Usage(), 0

        raw = {s: stage_score((r, main.score_of(r.id)) for r in buffer.stage_rubrics(s)) for s in judged_stages}
        fallback = TrajectoryScores()
        used_fallback = False
        if judged_stages and all(v is None for v in raw.values()):
            answer_score: float | None = None
            answer_rubrics = buffer.stage_rubrics("answer")
            if "answer" not in present:
                answer_score = 0.0  # D7: no answer is an Answer score of 0, not a failure
            elif answer_rubrics and main.failure in (None, "invalid"):
                # The stagewise answer was unusable but the endpoint works: score the answer alone (DR Tulu-style).
                fallback = await self.score_trajectory(
                    trajectory,
                    answer_rubrics,
                    stages=("answer",),
                    scope_note="Only the final answer is shown; score every rubric on it alone.",
                )
                answer_score = stage_score((r, fallback.score_of(r.id)) for r in answer_rubrics)
            final, used_fallback = answer_only_fallback(raw, answer_score)
        else:
            final = {s: raw.get(s) for s in STAGES}

        stages: dict[Stage, StageResult] = {}
        failed = 0
        for s in STAGES:
            stage_rubrics = buffer.stage_rubrics(s)
            source = fallback if (used_fallback and s == "answer" and fallback.called) else main
            rubric_scores = tuple(source.scores.get(r.id, RubricScore(rubric_id=r.id)) for r in stage_rubrics)
            if s not in present:
                if used_fallback and s != "answer":
                    stages[s] = StageResult(stage=s, score=None, error="answer-only fallback; " + ABSENT_NOTE)
                else:
                    stages[s] = StageResult(stage=s, score=0.0, error=ABSENT_NOTE)
            elif not stage_rubrics:
                stages[s] = StageResult(stage=s, score=None, error=NO_RUBRICS_NOTE)
            else:
                score = final.get(s)
                error = None
                if score is None:
                    failed += 1
                    reason = source.error or "the judge scored none of this stage's rubrics"
                    error = f"answer-only fallback: {reason}" if used_fallback and s != "answer" else reason
                stages[s] = StageResult(stage=s, score=score, rubric_scores=rubric_scores, error=error)

        scaffold: dict[str, Any] = {
            "stages_present": [s for s in STAGES if s in present],
            "absent_stages": [s for s in STAGES if s not in present],
            "malformed": trajectory.malformed,
            "scoring_error": main.error,
            "unscored_rubrics": sum(1 for r in rubrics if main.score_of(r.id) is None),
        }
        if used_fallback:
            scaffold["fallback_error"] = fallback.error
        if self.citation_support_check:
            scaffold["citation_support_failures"] = support_failed
        return _Outcome(
            stages=stages,
            citations=citations,
            scaffold=scaffold,
            failed_stages=failed,
            fallback_used=used_fallback,
            usage=main.usage + fallback.usage + support_usage,
            main=main,
            fallback=fallback,
        )

    @staticmethod
    def _raise_if_nothing_judged(generated: StageRubrics, outcomes: Sequence[_Outcome]) -> None:
        """Raise when nothing could be judged because of the endpoint itself.

        That is: no scoring call produced a single score, and every scoring call made (or, when there was nothing
        to score, the generation call) failed because the endpoint was down or rejected the request. A judge that
        answered, however badly, never raises: the judgements record the failure instead.
        """
        scoring = [ts for o in outcomes for ts in (o.main, o.fallback) if ts.called]
        if any(rs.score is not None for ts in scoring for rs in ts.scores.values()):
            return
        failures: list[Failure | None] = [ts.failure for ts in scoring] if scoring else [generated.failure]
        if any(f in (None, "invalid") for f in failures):
            return
        errors = [ts.error for ts in scoring] if scoring else [generated.error]
        detail = next((e for e in errors if e), "no detail")
        if "rejected" in failures:
            raise JudgeRequestError(f"the judge endpoint rejected the requests; nothing was judged ({detail})")
        raise JudgeUnavailable(f"the judge endpoint was unavailable; nothing was judged ({detail})")

    async def _load(self, question: str, deletions_seen: int | None) -> RubricBuffer:
        if self.store is None:
            return self._memory.get(question_sha(question)) or RubricBuffer.empty(question)
        return await asyncio.to_thread(load_buffer, self.store, question, deletions_seen)

    async def _save(self, buffer: RubricBuffer) -> RubricBuffer:
        if self.store is None:
            self._memory_saves += 1
            saved = replace(buffer, version=f"mem-{self._memory_saves}")
            self._memory[saved.key] = saved
            return saved
        return await asyncio.to_thread(save_unless_deleted, self.store, buffer)


@dataclass(frozen=True, slots=True)
class _Outcome:
    """One trajectory's judging outcome before it becomes a Judgement."""

    stages: dict[Stage, StageResult]
    citations: CitationCheck
    scaffold: dict[str, Any]
    failed_stages: int
    fallback_used: bool
    usage: Usage
    main: TrajectoryScores
    fallback: TrajectoryScores
