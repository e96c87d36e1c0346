"""A verifiable term in the Answer-stage reward, for training questions that carry a gold answer (issue 45).

Why: on SmolLM2-135M the offline judge's Answer score (MiniLM coverage of the agent's own checklist, plus the share
of citations that name a retrieved passage) often gives a group's rollouts the same score, so the group carries no
signal. DR Tulu rewards its short-form questions with a checkable answer; this does the same for questions that
have one, as an option of the judge (`TrainConfig.verifiable_weight`, 0 = off, the default).

With weight w > 0, for a question with a gold answer:

    R_answer' = (1 − w) · R_answer + w · v,   v = mean of the available terms below

- `answer_f1`: token F1 of the answer (its last `\\boxed{}`, else the whole answer, as the held-out cover-EM reads
  it) against the gold answer and its aliases, the best of them. F1, not cover-EM: at this model size cover-EM is
  almost always 0 (the held-out start scored 0.000), F1 gives partial credit for a partly right answer, and it is 1
  whenever the answer is exactly right.
- `cited_gold`: the share of the report's references that are gold passages (0 when it cites nothing: dropping
  citations must never pay), computed as the held-out citation precision is (`learning.eval.heldout.gold_share`);
  only for questions that name their gold passages.

Every judgement of a judge built with the option records what was done in `Judgement.verifiable`: the weight, the
terms and v, the Answer score before and after, or why nothing was added (no gold answer for the question; no
Answer score to mix into). A judge without the option leaves it None. The held-out evaluation never uses this judge:
its figures (`learning.eval.heldout`) are measured, not rewarded, and nothing is selected on a verifiable term.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.report import build_report
from learning.errors import LearningError
from learning.eval.heldout import gold_share, normalize_question
from learning.eval.scoring import extract_prediction, short_form_scores
from learning.judge.types import Judgement, JudgeKind, Rubric, StageResult, TrajectoryJudge
from store.records import Trajectory

VERIFIABLE_VERSION = "verifiable-1"  # bump when a term or its mixing changes


class GoldFileError(LearningError):
    """A question file's gold fields are malformed (the message names the line)."""


@dataclass(frozen=True, slots=True)
class Gold:
    """What a training question is checked against."""

    answers: tuple[str, ...]  # the gold answer first, then aliases
    titles: tuple[str, ...] = ()  # the gold passages' titles; empty when the question names none


def load_golds(path: Path) -> dict[str, Gold]:
    """normalised question -> Gold, from a .jsonl question file's optional `answers` (list of text) or `answer`
    (text) and `gold_titles` (list of text) fields; lines without an answer are left out; other files give {}.

    Raises:
        GoldFileError: a gold field of the wrong type, naming the line.
    """
    path = Path(path)
    if path.suffix != ".jsonl":
        return {}
    out: dict[str, Gold] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise GoldFileError(f"{path}:{n}: not JSON ({exc.msg})") from exc
        if not isinstance(rec, dict) or not isinstance(rec.get("question"), str):
            continue  # the question loader reports these
        if "answers" in rec:
            answers, field = rec["answers"], "answers"
        else:  # one `answer`; a blank one (DeepRubric writes "" for a pair without an answer) is no gold
            single = rec.get("answer")
            if single is not None and not isinstance(single, str):
                raise GoldFileError(f"{path}:{n}: 'answer' must be text")
            answers, field = ([single] if single and single.strip() else []), "answer"
        titles = rec.get("gold_titles", [])
        for name, value in ((field, answers), ("gold_titles", titles)):
            if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
                raise GoldFileError(f"{path}:{n}: '{name}' must be a list of non-empty strings")
        if answers:
            out[normalize_question(rec["question"])] = Gold(tuple(answers), tuple(titles))
    return out


def verifiable_terms(trajectory: Trajectory, gold: Gold) -> dict[str, float]:
    """The checkable terms of one trajectory against its gold (see the module docstring)."""
    report = build_report(trajectory)
    body = report.body if report.answer_found else ""
    terms = {"answer_f1": short_form_scores(extract_prediction(body), gold.answers)["f1"] if body else 0.0}
    if gold.titles:
        terms["cited_gold"] = gold_share(gold.titles, [s.title for s in report.references])
    return terms


def mix(answer: float, terms: Mapping[str, float], weight: float) -> tuple[float, float]:
    """(v, the mixed Answer score): v is the mean of the terms, mixed as (1 − w) · answer + w · v."""
    v = sum(terms.values()) / len(terms)
    return v, (1.0 - weight) * answer + weight * v


class VerifiableJudge:
    """A `TrajectoryJudge` that adds the verifiable term to another judge's Answer score (module docstring)."""

    def __init__(self, inner: TrajectoryJudge, golds: Mapping[str, Gold], weight: float) -> None:
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"verifiable weight must be in (0, 1], got {weight}")
        self.inner = inner
        self.golds = dict(golds)
        self.weight = weight
        self.kind: JudgeKind = inner.kind
        self.model = inner.model

    async def judge_group(self, question: str, trajectories: Sequence[Trajectory],
                          persistent: Sequence[Rubric] = (), *, session_rubrics: Sequence[Rubric] = (),
                          deletions_seen: int | None = None) -> list[Judgement]:
        judgements = await self.inner.judge_group(question, trajectories, persistent, session_rubrics=session_rubrics,
                                                  deletions_seen=deletions_seen)
        gold = self.golds.get(normalize_question(question))
        return [self._with_term(j, t, gold) for j, t in zip(judgements, trajectories, strict=True)]

    def _with_term(self, judgement: Judgement, trajectory: Trajectory, gold: Gold | None) -> Judgement:
        record: dict[str, Any] = {"version": VERIFIABLE_VERSION, "weight": self.weight}
        answer = judgement.stages.get("answer")
        if gold is None:
            record["applied"] = "no: the question has no gold answer"
        elif answer is None or answer.score is None or not math.isfinite(answer.score):
            record["applied"] = "no: the judge gave no Answer score to mix into"
        else:
            terms = verifiable_terms(trajectory, gold)
            v, mixed = mix(answer.score, terms, self.weight)
            record |= {"applied": "yes", "terms": {k: round(x, 4) for k, x in terms.items()}, "v": round(v, 4),
                       "answer_before": round(answer.score, 4), "answer_after": round(mixed, 4)}
            stages = dict(judgement.stages)
            stages["answer"] = StageResult(stage="answer", score=mixed, rubric_scores=answer.rubric_scores,
                                           error=answer.error)
            return judgement.model_copy(update={"stages": stages, "verifiable": record})
        return judgement.model_copy(update={"verifiable": record})
