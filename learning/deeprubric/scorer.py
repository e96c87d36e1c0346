"""Scoring trajectories against a pair's criteria on the 0–4 scale, and the DeepRubric reward of a group.

Two criterion scorers, one shape:
- `LLMCriterionScorer`: a judge endpoint (the project's `JudgeClient`: retries, cache, concurrency, cost) rates every
  criterion of one answer in ONE call (`learning/prompts/deeprubric_criteria.md`); factual criteria are shown with
  their evidence, negative-weight ones marked as undesirable. A failed call leaves that answer's criteria unscored
  (None, never 0); an answer with an id missing from the reply has that criterion unscored.
- `OfflineCriterionScorer`: no endpoint. Each criterion (description, plus evidence for factual ones) against the
  answer's best-matching sentence by MiniLM cosine similarity, as the offline judge approximates rubric coverage,
  mapped onto 0–4 (`reward.score_from_similarity`). Approximate, and labelled so.

`RubricReward` is what the trainer calls for `reward = "deeprubric"`: the §11.6 reward of each trajectory of a
question's group (`learning/deeprubric/reward.py` holds the maths and the decisions).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from learning.deeprubric import reward as rw
from learning.deeprubric.pairs import PairCriterion, QueryPair
from learning.errors import JudgeError, JudgeUnavailable
from learning.judge.offline import answer_sentences
from learning.judge.types import JsonJudge, Usage
from learning.prompts import messages
from store.records import Trajectory

__all__ = ["CriterionScorer", "GroupScores", "LLMCriterionScorer", "OfflineCriterionScorer", "RubricReward",
           "criterion_text", "score_pair"]

ANSWER_CHARS = 24_000


def criterion_text(c: PairCriterion) -> str:
    """A criterion as shown to a scorer: its description, and its evidence when it is factual."""
    text = c.description
    if c.type == "factual" and c.evidence:
        text += " Evidence: " + " ".join(c.evidence)
    return text


class GroupScores(BaseModel):
    """0–4 scores per trajectory per criterion (None: unscored), with the scorer's identity and cost."""

    model_config = ConfigDict(frozen=True)

    scores: list[list[float | None]]
    scorer: str
    approximate: bool
    usage: Usage = Usage()
    errors: list[str] = Field(default_factory=list)


class CriterionScorer(Protocol):
    """Rates each criterion 0–4 for each trajectory's answer."""

    model: str
    approximate: bool

    async def score(self, question: str, trajectories: Sequence[Trajectory],
                    criteria: Sequence[PairCriterion]) -> GroupScores:
        """Scores[i][k] for trajectory i and criterion k."""
        ...


class OfflineCriterionScorer:
    """MiniLM similarity → 0–4 (module docstring). Raises JudgeUnavailable when the embedding model cannot load."""

    model = "offline-minilm"
    approximate = True

    def __init__(self, embedding_model: str = "") -> None:
        self.embedding_model = embedding_model

    async def score(self, question: str, trajectories: Sequence[Trajectory],
                    criteria: Sequence[PairCriterion]) -> GroupScores:
        from store.embeddings import EmbeddingModelError, embed_texts  # lazy: loads sentence-transformers

        sentences = [answer_sentences(t) if rw.answer_body(t) else [] for t in trajectories]
        texts = [criterion_text(c) for c in criteria] + [s for group in sentences for s in group]
        try:
            vectors = await asyncio.to_thread(embed_texts, texts, self.embedding_model)
        except EmbeddingModelError as exc:
            raise JudgeUnavailable(f"the offline criterion scorer cannot load its embedding model: {exc}") from exc
        matrix = np.stack(vectors)  # (C + S, dim), L2-normalised
        crit = matrix[: len(criteria)]  # (C, dim)
        out: list[list[float | None]] = []
        start = len(criteria)
        for group in sentences:
            if not group:
                out.append([0.0] * len(criteria))  # no answer: nothing is covered
                continue
            best = (crit @ matrix[start : start + len(group)].T).max(axis=1)  # (C,)
            start += len(group)
            out.append([float(rw.score_from_similarity(float(s))) for s in best])
        return GroupScores(scores=out, scorer=self.model, approximate=True)


class _Item(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str
    score: int = Field(ge=0, le=4)
    reason: str = ""


class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore")

    scores: list[_Item]


_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"scores": {"type": "array", "items": {
        "type": "object",
        "properties": {"id": {"type": "string"}, "score": {"type": "integer", "minimum": 0, "maximum": 4},
                       "reason": {"type": "string"}},
        "required": ["id", "score", "reason"], "additionalProperties": False}}},
    "required": ["scores"],
    "additionalProperties": False,
}


def _criteria_block(criteria: Sequence[PairCriterion]) -> str:
    lines = []
    for c in criteria:
        head = f'<criterion id="{c.id}" type="{c.type}" weight="{c.weight:g}"' + (
            ' undesirable="true">' if c.weight < 0 else ">")
        body = c.description
        if c.type == "factual" and c.evidence:
            body += "\n<evidence>\n" + "\n".join(c.evidence) + "\n</evidence>"
        lines.append(f"{head}\n{body}\n</criterion>")
    return "\n".join(lines)


class LLMCriterionScorer:
    """One judge call per answer rating all its criteria 0–4 (module docstring)."""

    approximate = False

    def __init__(self, client: JsonJudge) -> None:
        self.client = client
        self.model = client.model

    async def score(self, question: str, trajectories: Sequence[Trajectory],
                    criteria: Sequence[PairCriterion]) -> GroupScores:
        block = _criteria_block(criteria)

        async def one(t: Trajectory) -> tuple[list[float | None], Usage, str | None]:
            body = rw.answer_body(t)
            if not body:
                return [0.0] * len(criteria), Usage(), None  # nothing to read: nothing is covered (no call)
            try:
                call = await self.client.complete_json(
                    messages("deeprubric_criteria", question=question, answer=body[:ANSWER_CHARS], criteria=block),
                    _SCHEMA, name="deeprubric_criteria", validate=_Answer.model_validate, max_tokens=2048)
            except JudgeError as exc:
                return [None] * len(criteria), exc.usage or Usage(), f"{type(exc).__name__}: {exc}"
            data = call.data if isinstance(call.data, _Answer) else _Answer.model_validate(call.data)
            by_id = {i.id: float(i.score) for i in data.scores}
            return [by_id.get(c.id) for c in criteria], call.usage, None

        results = await asyncio.gather(*(one(t) for t in trajectories))
        return GroupScores(scores=[r[0] for r in results], scorer=self.model, approximate=False,
                           usage=sum((r[1] for r in results), Usage()), errors=[r[2] for r in results if r[2]])


class RubricReward:
    """The §11.6 reward of a question's group, against that question's pair (the trainer's `deeprubric` reward)."""

    def __init__(self, pairs: Mapping[str, QueryPair], scorer: CriterionScorer) -> None:
        self.pairs = dict(pairs)
        self.scorer = scorer

    @property
    def approximate(self) -> bool:
        return bool(self.scorer.approximate)

    async def __call__(self, question: str, trajectories: Sequence[Trajectory]) -> list[rw.Breakdown]:
        """One Breakdown per trajectory; KeyError when the question has no pair."""
        breakdowns, _group = await score_pair(self.scorer, self.pairs[question], trajectories)
        return breakdowns


async def score_pair(scorer: CriterionScorer, pair: QueryPair, trajectories: Sequence[Trajectory]
                     ) -> tuple[list[rw.Breakdown], GroupScores]:
    """Score each trajectory against the pair's criteria and combine the §11.6 terms; also the raw 0–4 scores."""
    group = await scorer.score(pair.question, trajectories, pair.criteria)
    out = []
    for t, row in zip(trajectories, group.scores, strict=True):
        rubric = rw.rubric_term([rw.Criterion(c.weight, s) for c, s in zip(pair.criteria, row, strict=True)])
        out.append(rw.combine(rw.features(t), rubric))
    return out, group
