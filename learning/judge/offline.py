"""The offline judge: an APPROXIMATE stage grade for machines without a judge model (CI, laptops).

It is not a grade by a reader. Answer = rubric coverage by MiniLM embedding similarity, plus citation precision;
Plan/Research/Review = transparent scaffold-compliance and evidence-use formulas. Same `Judgement` type as the LLM
judge, marked `approximate=True`, `judge_kind="offline"`, so everything downstream runs unchanged.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from agent.parse import strip_process_blocks, strip_tags
from agent.report import build_report
from agent.support import check_support, content_words
from learning.errors import JudgeUnavailable
from learning.judge.aggregate import stage_score
from learning.judge.buffer import RubricBuffer, load_buffer, normalise_title, save_unless_deleted
from learning.judge.citations import answer_text, check_citations
from learning.judge.types import (
    CitationCheck,
    JudgeKind,
    Judgement,
    Rubric,
    RubricBufferStore,
    RubricScore,
    StageResult,
)
from store.records import STAGES, Stage, Trajectory, sha256_text

OFFLINE_MODEL = "offline-minilm"
OFFLINE_VERSION = "offline-3"  # recorded as the prompt_version: bump when a formula or threshold below changes

# Cosine similarity (L2-normalised MiniLM vectors) between a rubric and its best-matching answer sentence → 0/1/2.
# Measured with all-MiniLM-L6-v2: a sentence stating what a checklist item asks scores ~0.6-0.9, the same topic
# without the asked fact ~0.35-0.55, unrelated text ~0.05-0.2. So: >= SIM_FULL → 2 (covered), >= SIM_PARTIAL → 1
# (touched on), else 0.
SIM_FULL = 0.55
SIM_PARTIAL = 0.35
# Answer R = 0.7 · coverage + 0.3 · citation precision (0 when nothing is cited). Citation precision counts a cited
# id only when it names a retrieved passage that supports its sentence (agent/support.py, issue 48): a citation to a
# retrieved but unrelated passage scores as a wrong one. `CitationCheck.precision` keeps the id-validity share.
COVERAGE_WEIGHT = 0.7
CITATION_WEIGHT = 0.3
# A sentence that only restates covers nothing: it must carry a content word (agent/support.content_words) that
# the question does not have, and, against a rubric the policy wrote itself (its checklist, or the question as the
# fallback rubric), one the rubric does not have either. Why: measured in the gate test on 2026-11-29, the base model
# answered 'to the question "Who was Haymo of Faversham?"', matched the question-as-rubric at cosine > 0.55 and got
# Answer 0.7, above the SFT adapter's real answer; echoing the own checklist was the reward hack of the learning
# curve (README). A gold rubric (persistent) may contain the answer, so restating it does count.
SELF_WRITTEN_SOURCES = frozenset({"agent_checklist", "question"})
SEARCH_TARGET = 3  # research volume saturates at 3 tool calls (DR Tulu's search reward: min(#queries / 3, 1))
MAX_SENTENCES = 200
MAX_CHECKLIST_ITEMS = 12
ABSENT_NOTE = "stage absent from the trajectory (METHOD D7): R = 0"

RubricSource = Literal["persistent", "agent_checklist", "question"]

_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+|\n+")
_BULLET = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s*")


def _block(text: str, *names: str) -> str:
    """The stripped body of the first closed `<name>…</name>` block (any alias), or ""."""
    for name in names:
        m = re.search(rf"<{name}\b[^>]*>(.*?)</{name}\s*>", text, re.IGNORECASE | re.DOTALL)
        if m and m.group(1).strip():
            return m.group(1).strip()
    return ""


def stage_text(trajectory: Trajectory, stage: Stage) -> str:
    """The model-written text of one stage (sampled and forced turns; tool outputs left out)."""
    return "".join(t.text for t in trajectory.turns if t.stage == stage and t.kind != "tool_output")


def checklist_items(trajectory: Trajectory) -> list[str]:
    """The agent's own `<rubric>` checklist items from its plan: one per line or per inline " - " bullet.

    Header-like segments ending in ":" ("Knowledge Checklist:") and fragments of fewer than 3 letters are dropped.
    """
    return plan_checklist(stage_text(trajectory, "plan"))


def plan_checklist(plan_text: str) -> list[str]:
    """The checklist items of a plan's `<rubric>` block (see `checklist_items`); [] when there is none."""
    body = _block(plan_text, "rubric", "rubrics")
    items: list[str] = []
    for line in body.splitlines():
        for part in re.split(r"\s+-\s+|(?<=:)\s*-\s+", line):
            item = _BULLET.sub("", part).strip()
            if not item or item.endswith(":") or len(re.sub(r"[^A-Za-z]", "", item)) < 3:
                continue
            items.append(item)
    return items


def answer_sentences(trajectory: Trajectory) -> list[str]:
    """The answer as plain sentences (cite tags removed, claims kept), at most MAX_SENTENCES."""
    text = strip_tags(strip_process_blocks(answer_text(trajectory)))
    sentences = [s.strip() for s in _SENTENCE_SPLIT.split(text)]
    return [s for s in sentences if len(s) >= 3][:MAX_SENTENCES]


def similarity_score(similarity: float) -> int:
    """Map a best-sentence cosine similarity to a 0/1/2 rubric score (thresholds above)."""
    if similarity >= SIM_FULL:
        return 2
    if similarity >= SIM_PARTIAL:
        return 1
    return 0


def plan_components(trajectory: Trajectory) -> dict[str, float]:
    """Plan: 1 for each of <deep_analysis>, <rubric> (with at least one item) and <research_plan> with content."""
    text = stage_text(trajectory, "plan")
    return {
        "deep_analysis": 1.0 if _block(text, "deep_analysis", "analysis") else 0.0,
        "rubric": 1.0 if checklist_items(trajectory) else 0.0,
        "research_plan": 1.0 if _block(text, "research_plan") else 0.0,
    }


def research_components(trajectory: Trajectory) -> dict[str, float]:
    """Research: volume min(calls/3, 1); success = calls without error / calls; diversity = distinct queries / calls.

    With no tool call at all every component is 0.
    """
    calls = trajectory.tool_calls
    n = len(calls)
    if n == 0:
        return {"volume": 0.0, "success": 0.0, "diversity": 0.0}
    distinct = {" ".join(c.query.lower().split()) for c in calls}
    return {
        "volume": min(n / SEARCH_TARGET, 1.0),
        "success": sum(1 for c in calls if c.error is None) / n,
        "diversity": len(distinct) / n,
    }


def review_components(trajectory: Trajectory) -> dict[str, float]:
    """Review: 1 for a non-empty <rubric_review>, 1 for a non-empty <writing_plan>, 1 if it names a retrieved snippet."""
    text = stage_text(trajectory, "review")
    ids = trajectory.snippets
    return {
        "rubric_review": 1.0 if _block(text, "rubric_review", "rubrics_review") else 0.0,
        "writing_plan": 1.0 if _block(text, "writing_plan") else 0.0,
        "cites_evidence": 1.0 if any(i in text for i in ids) else 0.0,
    }


def _component_result(stage: Stage, components: dict[str, float]) -> StageResult:
    """A stage scored as the plain mean of its components; each shown as a pseudo-rubric rounded to 0/1/2."""
    scores = tuple(
        RubricScore(rubric_id=f"offline:{stage}:{name}", score=round(value * 2), justification=f"{name} = {value:.2f}")
        for name, value in components.items()
    )
    return StageResult(stage=stage, score=sum(components.values()) / len(components), rubric_scores=scores)


@dataclass(frozen=True, slots=True)
class _AnswerRubrics:
    rubrics: tuple[Rubric, ...]
    source: RubricSource


class OfflineJudge:
    """Approximate `TrajectoryJudge` using the bundled MiniLM; see the module docstring for every formula.

    Answer-stage rubrics are, in order of preference: the persistent rubrics (given, or saved in the store); else the
    agent's own `<rubric>` checklist items pooled over the whole group (a stand-in, so every trajectory of a group
    is measured against the same list); else the question itself as the one rubric.
    """

    kind: JudgeKind = "offline"
    model: str = OFFLINE_MODEL
    approximate = True

    def __init__(self, store: RubricBufferStore | None = None, embedding_model: str = "") -> None:
        """Set up the judge.

        Args:
            store: where persistent rubrics are read from (and saved to when new ones are given); None = none.
            embedding_model: sentence-transformers model; "" = the bundled all-MiniLM-L6-v2.
        """
        self.store = store
        self.embedding_model = embedding_model

    async def judge_group(
        self, question: str, trajectories: Sequence[Trajectory], persistent: Sequence[Rubric] = (), *,
        session_rubrics: Sequence[Rubric] = (), deletions_seen: int | None = None,
    ) -> list[Judgement]:
        """One approximate Judgement per trajectory, in order (`session_rubrics`: for this group only, never saved;
        `deletions_seen`: as for `TrajectoryJudge`, a deletion since then keeps new persistent rubrics unsaved).

        Raises:
            JudgeUnavailable: the embedding model cannot be loaded (nothing could be judged).
        """
        if not trajectories:
            return []
        buffer = (await self._buffer(question, persistent, deletions_seen)).with_persistent(session_rubrics)
        chosen = self._answer_rubrics(question, trajectories, buffer)
        similarities = await self._similarities(chosen, trajectories, question)
        support = await self._support(trajectories)
        return [
            self._judge_one(t, chosen, sims, buffer.version, sup)
            for t, sims, sup in zip(trajectories, similarities, support, strict=True)
        ]

    async def _support(self, trajectories: Sequence[Trajectory]) -> list[tuple[int, int]]:
        """Per trajectory, the model's own citations checked against their passages (agent/support.py, the check
        the report gets, before any repair): (claims checked, cited passages that support their claim)."""
        from functools import partial

        from store.embeddings import EmbeddingModelError, embed_texts

        embed = partial(embed_texts, model_name=self.embedding_model)

        def one(t: Trajectory) -> tuple[int, int]:
            report = build_report(t)
            if not report.references:
                return 0, 0
            check = check_support(report.body, report.references, list(t.snippets.values()), embed).check
            return len(check.claims), sum(len(set(c.kept) & set(c.cited)) for c in check.claims)

        try:
            return await asyncio.to_thread(lambda: [one(t) for t in trajectories])
        except EmbeddingModelError as exc:
            raise JudgeUnavailable(f"the offline judge cannot load its embedding model: {exc}") from exc

    async def _buffer(self, question: str, persistent: Sequence[Rubric], deletions_seen: int | None) -> RubricBuffer:
        if self.store is None:
            return RubricBuffer.empty(question).with_persistent(persistent)
        loaded = await asyncio.to_thread(load_buffer, self.store, question, deletions_seen)
        updated = loaded.with_persistent(persistent)
        if updated is loaded:
            return loaded
        return await asyncio.to_thread(save_unless_deleted, self.store, updated)  # keep the new persistent rubrics

    @staticmethod
    def _answer_rubrics(question: str, trajectories: Sequence[Trajectory], buffer: RubricBuffer) -> _AnswerRubrics:
        if buffer.persistent:
            return _AnswerRubrics(buffer.persistent, "persistent")
        pooled: dict[str, str] = {}
        for t in trajectories:
            for item in checklist_items(t):
                pooled.setdefault(normalise_title(item), item)
        items = list(pooled.values())[:MAX_CHECKLIST_ITEMS]
        if items:
            rubrics = tuple(
                Rubric(id=f"agent-{sha256_text(normalise_title(i))[:10]}", stage="answer", title=i, description="",
                       weight=1)
                for i in items
            )  # fmt: skip
            return _AnswerRubrics(rubrics, "agent_checklist")
        only = Rubric(id="question", stage="answer", title=question, description="", weight=1)
        return _AnswerRubrics((only,), "question")

    async def _similarities(
        self, chosen: _AnswerRubrics, trajectories: Sequence[Trajectory], question: str
    ) -> list[list[tuple[float, str]]]:
        """Per trajectory, per rubric: (best cosine similarity, best sentence) over the sentences that say more than
        the question and a self-written rubric (SELF_WRITTEN_SOURCES); (0.0, "") for an empty answer or one that only
        restates."""
        from store.embeddings import EmbeddingModelError, embed_texts  # lazy: loads sentence-transformers

        rubrics = chosen.rubrics
        sentences = [answer_sentences(t) for t in trajectories]
        rubric_texts = [f"{r.title}: {r.description}" if r.description else r.title for r in rubrics]
        self_written = chosen.source in SELF_WRITTEN_SOURCES
        asked = content_words(question)
        known = [asked | content_words(text) if self_written else asked for text in rubric_texts]
        texts = rubric_texts + [s for group in sentences for s in group]
        try:
            vectors = await asyncio.to_thread(embed_texts, texts, self.embedding_model)
        except EmbeddingModelError as exc:
            raise JudgeUnavailable(f"the offline judge cannot load its embedding model: {exc}") from exc
        matrix = np.stack(vectors) if vectors else np.zeros((0, 1), dtype=np.float32)  # (R + S, dim)
        rubric_vecs = matrix[: len(rubrics)]  # (R, dim)
        out: list[list[tuple[float, str]]] = []
        start = len(rubrics)
        for group in sentences:
            if not group:
                out.append([(0.0, "")] * len(rubrics))
                continue
            sims = rubric_vecs @ matrix[start : start + len(group)].T  # (R, S): cosine, vectors are normalised
            start += len(group)
            words = [content_words(s) for s in group]
            adds = np.array([[bool(w - k) for w in words] for k in known], dtype=bool).reshape(sims.shape)
            sims = np.where(adds, sims, -np.inf)
            best = sims.argmax(axis=1)
            out.append([(float(sims[i, j]), group[j]) if adds[i, j] else (0.0, "") for i, j in enumerate(best)])
        return out

    def _judge_one(
        self, trajectory: Trajectory, chosen: _AnswerRubrics, sims: list[tuple[float, str]], version: str,
        support: tuple[int, int] = (0, 0),
    ) -> Judgement:
        present = trajectory.stages_present
        checked, supported = support
        citations: CitationCheck = check_citations(trajectory).model_copy(
            update={"support_checked": checked, "supported": supported})
        components: dict[str, Any] = {}
        stages: dict[Stage, StageResult] = {}
        measures: tuple[tuple[Stage, Callable[[Trajectory], dict[str, float]]], ...] = (
            ("plan", plan_components),
            ("research", research_components),
            ("review", review_components),
        )
        for stage, measure in measures:
            parts = measure(trajectory)
            components[stage] = parts
            stages[stage] = (
                _component_result(stage, parts)
                if stage in present
                else StageResult(stage=stage, score=0.0, error=ABSENT_NOTE)
            )

        unmatched = " (only restates the question or the rubric)" if answer_sentences(trajectory) else " (no answer)"
        scored = [
            RubricScore(
                rubric_id=r.id,
                score=similarity_score(sim),
                justification=f"max cosine {sim:.2f}" + (f" with: {sentence[:200]!r}" if sentence else unmatched),
            )
            for r, (sim, sentence) in zip(chosen.rubrics, sims, strict=True)
        ]
        coverage = stage_score((r, s.score) for r, s in zip(chosen.rubrics, scored, strict=True))
        supported_precision = min(1.0, supported / citations.cited) if citations.cited else None
        precision = supported_precision if supported_precision is not None else 0.0
        components["answer"] = {
            "coverage": coverage,
            "citation_precision": supported_precision,
            "citation_validity": citations.precision,
            "rubric_source": chosen.source,
            "rubrics": [{"id": r.id, "title": r.title} for r in chosen.rubrics],
        }
        if "answer" in present and coverage is not None:
            value = COVERAGE_WEIGHT * coverage + CITATION_WEIGHT * precision
            stages["answer"] = StageResult(stage="answer", score=value, rubric_scores=tuple(scored))
        else:
            stages["answer"] = StageResult(stage="answer", score=0.0, error=ABSENT_NOTE)

        return Judgement(
            session_id=trajectory.session_id,
            question=trajectory.question,
            stages={s: stages[s] for s in STAGES},
            citations=citations,
            scaffold={
                "stages_present": [s for s in STAGES if s in present],
                "absent_stages": [s for s in STAGES if s not in present],
                "malformed": trajectory.malformed,
                "approximate": True,
                "note": "offline approximate judge: embedding similarity and scaffold checks, not a graded reading",
                "offline": components,
            },
            judge_model=OFFLINE_MODEL,
            judge_kind="offline",
            approximate=True,
            rubric_version=version,
            prompt_version=OFFLINE_VERSION,
        )
