"""The reflection judge (METHOD §6.4, D8): grades reflection candidates on a graded trajectory.

A candidate is valid only with exactly one `<reflection_rubrics>` and one `<reflection_takeaways>` block; invalid ones
get `valid=False`, `u=None` and are never shown to the judge. Valid ones are graded together in one call on
Diagnostic Accuracy, Specificity and Scope & Balance, and u = ½(u_within + u_cross) with D8's mapping.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from learning.errors import JudgeOutputInvalid
from learning.judge.llm import STAGE_NAMES, render_rubric_line, render_trajectory
from learning.judge.types import JsonJudge, Judgement, ReflectionScore, Rubric, RubricScore
from learning.prompts import messages
from store.records import STAGES, Trajectory

W_DIAGNOSTIC, W_SPECIFICITY, W_SCOPE = 0.4, 0.3, 0.3  # the paper's dimension weights (METHOD §6.4)
CANDIDATE_CHARS = 4000  # each candidate is cut to this in the judge prompt
BLOCKS = ("reflection_rubrics", "reflection_takeaways")


def reflection_reward(
    diagnostic_accuracy: float, specificity: float, scope_balance: float
) -> tuple[float, float, float]:
    """(u_within, u_cross, u) from the three grades (D8).

    u_within = (0.4·DA + 0.3·Spec) / 0.7, u_cross = S&B, u = ½(u_within + u_cross).
    Example: DA 0.8, Spec 0.5, S&B 0.6 → u_within ≈ 0.671, u ≈ 0.636.
    """
    u_within = (W_DIAGNOSTIC * diagnostic_accuracy + W_SPECIFICITY * specificity) / (W_DIAGNOSTIC + W_SPECIFICITY)
    u_cross = scope_balance
    return u_within, u_cross, 0.5 * (u_within + u_cross)


def validity_error(candidate: str) -> str | None:
    """Why a candidate is not in the required two-block format, or None if it is.

    Required: exactly one `<reflection_rubrics>…</reflection_rubrics>` and exactly one
    `<reflection_takeaways>…</reflection_takeaways>`, each with non-empty content.
    """
    for tag in BLOCKS:
        opens = len(re.findall(rf"<{tag}\s*>", candidate, re.IGNORECASE))
        closes = len(re.findall(rf"</{tag}\s*>", candidate, re.IGNORECASE))
        blocks = re.findall(rf"<{tag}\s*>(.*?)</{tag}\s*>", candidate, re.IGNORECASE | re.DOTALL)
        if opens != 1 or closes != 1 or len(blocks) != 1:
            return f"needs exactly one <{tag}>...</{tag}> block (found {opens} opening, {closes} closing tags)"
        if not blocks[0].strip():
            return f"the <{tag}> block is empty"
    return None


class CandidateGrade(BaseModel):
    """The judge's grades of one candidate."""

    model_config = ConfigDict(extra="forbid")

    candidate: int
    diagnostic_accuracy: float
    specificity: float
    scope_balance: float
    justification: str


class ReflectionAnswer(BaseModel):
    """The reflection judge's answer: one grade per candidate shown."""

    model_config = ConfigDict(extra="forbid")

    grades: list[CandidateGrade]


def grades_validator(shown: Sequence[int]) -> Callable[[object], ReflectionAnswer]:
    """A `validate` callable: candidate numbers among those shown, no duplicates, grades in [0, 1], non-empty."""
    allowed = set(shown)

    def validate(data: object) -> ReflectionAnswer:
        answer = ReflectionAnswer.model_validate(data)
        if not answer.grades:
            raise ValueError("the grades list is empty")
        seen: set[int] = set()
        for g in answer.grades:
            if g.candidate not in allowed:
                raise ValueError(f"candidate {g.candidate} was not shown (shown: {sorted(allowed)})")
            if g.candidate in seen:
                raise ValueError(f"candidate {g.candidate} is graded twice")
            seen.add(g.candidate)
            for name in ("diagnostic_accuracy", "specificity", "scope_balance"):
                value = getattr(g, name)
                if not 0.0 <= value <= 1.0:
                    raise ValueError(f"candidate {g.candidate}: {name} {value} is outside [0, 1]")
        return answer

    return validate


def render_graded_rubrics(judgement: Judgement, rubrics: Sequence[Rubric]) -> str:
    """Rubrics by stage with R_k, each with the grader's 0/1/2 score and justification (what the judge is shown)."""
    lines: list[str] = []
    for stage in STAGES:
        result = judgement.stages.get(stage)
        r_k = "unscored" if result is None or result.score is None else f"{result.score:.2f}"
        lines.append(f"### Stage {STAGES.index(stage) + 1}: {STAGE_NAMES[stage]} (stage score R = {r_k})")
        if result is not None and result.error:
            lines.append(f"(note: {result.error})")
        by_id: Mapping[str, RubricScore] = {rs.rubric_id: rs for rs in result.rubric_scores} if result else {}
        stage_rubrics = [r for r in rubrics if r.stage == stage]
        if not stage_rubrics:
            lines.append("(no rubrics)")
        for r in stage_rubrics:
            rs = by_id.get(r.id)
            verdict = "not scored" if rs is None or rs.score is None else f"score {rs.score}/2"
            why = f" — {rs.justification}" if rs is not None and rs.justification else ""
            lines.append(f"{render_rubric_line(None, r)}\n    grader: {verdict}{why}")
    return "\n".join(lines)


class ReflectionJudge:
    """Grades reflection candidates with a privileged view of the graded trajectory (METHOD §6.4)."""

    def __init__(self, client: JsonJudge, *, trajectory_chars: int = 12000, candidate_chars: int = CANDIDATE_CHARS):
        """Set up the judge.

        Args:
            client: the JSON judge endpoint.
            trajectory_chars: the trajectory is cut to this many characters in the prompt.
            candidate_chars: each candidate is cut to this many characters in the prompt.
        """
        self.client = client
        self.trajectory_chars = trajectory_chars
        self.candidate_chars = candidate_chars

    @property
    def model(self) -> str:
        """The judge model id."""
        return self.client.model

    async def score(
        self,
        question: str,
        trajectory: Trajectory,
        judgement: Judgement,
        rubrics: Sequence[Rubric],
        candidates: Sequence[str],
    ) -> list[ReflectionScore]:
        """One ReflectionScore per candidate, in order (`candidate` = its index in `candidates`).

        Invalid candidates are never sent. If the judge's answer is unusable (after the client's repair retry), each
        valid candidate gets u=None with the error; a candidate the judge skipped gets u=None too.

        Raises:
            JudgeUnavailable / JudgeRequestError: the endpoint was down or rejected the request (nothing graded).
        """
        results: dict[int, ReflectionScore] = {}
        shown: list[int] = []
        for i, text in enumerate(candidates):
            error = validity_error(text)
            if error is None:
                shown.append(i)
            else:
                results[i] = ReflectionScore(candidate=i, valid=False, error=error)
        if shown:
            results.update(await self._grade(question, trajectory, judgement, rubrics, candidates, shown))
        return [results[i] for i in range(len(candidates))]

    async def _grade(
        self,
        question: str,
        trajectory: Trajectory,
        judgement: Judgement,
        rubrics: Sequence[Rubric],
        candidates: Sequence[str],
        shown: Sequence[int],
    ) -> dict[int, ReflectionScore]:
        listing = "\n\n".join(f"### Candidate {i}\n{candidates[i].strip()[: self.candidate_chars]}" for i in shown)
        prompt = messages(
            "reflection_judge",
            question=question,
            graded_rubrics=render_graded_rubrics(judgement, rubrics),
            trajectory=render_trajectory(trajectory, self.trajectory_chars),
            candidates=listing,
        )
        try:
            call = await self.client.complete_json(
                prompt,
                ReflectionAnswer.model_json_schema(),
                name="reflection_judge",
                validate=grades_validator(shown),
            )
        except JudgeOutputInvalid as exc:
            error = f"{type(exc).__name__}: {exc}"
            return {i: ReflectionScore(candidate=i, valid=True, error=error) for i in shown}
        answer: ReflectionAnswer = call.data
        by_candidate = {g.candidate: g for g in answer.grades}
        out: dict[int, ReflectionScore] = {}
        for i in shown:
            g = by_candidate.get(i)
            if g is None:
                out[i] = ReflectionScore(candidate=i, valid=True, error="the judge did not grade this candidate")
                continue
            u_within, u_cross, u = reflection_reward(g.diagnostic_accuracy, g.specificity, g.scope_balance)
            out[i] = ReflectionScore(
                candidate=i,
                valid=True,
                diagnostic_accuracy=g.diagnostic_accuracy,
                specificity=g.specificity,
                scope_balance=g.scope_balance,
                u_within=u_within,
                u_cross=u_cross,
                u=u,
                justification=g.justification.strip(),
            )
        return out
