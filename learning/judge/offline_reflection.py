"""The offline reflection judge: an APPROXIMATE, deterministic stand-in for the LLM reflection judge (METHOD §6.4).

It is for machines without a judge model (CI, laptops). It does not read the reflection the way a judge would. It
measures three things a judge would look at, with fixed formulas, and turns them into the judge's three dimensions.
It has the same `score(...)` signature as `learning.judge.reflection.ReflectionJudge`, and u follows D8 through
`reflection_reward`. Every formula and threshold is below; bump OFFLINE_REFLECTION_VERSION when one changes.

Units. A candidate is split into *items*: the non-empty lines of its two blocks, without list bullets, each with at
least MIN_ITEM_LETTERS letters. *Content words* are lower-cased words of at least 3 characters (or any number), not in
STOPWORDS, crudely stemmed (a trailing "ing", "ed", "es" or "s" is dropped while 4 or more characters remain).

Diagnostic Accuracy (DA): does the reflection address what the grader flagged?
- Targets. Weak rubrics: every scored rubric whose oriented score s' (D3: s for a positive rubric, 2 − s for a
  negative one) is below 2. Its text is "title. justification" and its weight is w · (2 − s') / 2 (a 0 counts fully,
  a 1 half). Rubric ids that are not in the rubric list (the offline trajectory judge's pseudo-rubrics) use the title
  the judgement names for them, or the id made readable, with w = 1. Without weak rubrics, the targets are the
  rubrics scored 2 (the reflection should then recognise what worked), and without any scored rubric the question.
- coverage = Σ weight · ramp(best cosine between the target and any item) / Σ weight, with MiniLM cosines (normalised
  vectors) and ramp(x) = clamp((x − SIM_LOW) / (SIM_HIGH − SIM_LOW), 0, 1). SIM_LOW 0.20 is about where unrelated
  sentences sit; SIM_HIGH 0.55 is where a sentence states what a rubric asks (the offline trajectory judge's
  measured ranges, learning/judge/offline.py).
- Weak stages: stages whose R is below WEAK_STAGE (0.5), absent stages included (they score 0, D7). A weak stage is
  named when the reflection uses one of its STAGE_WORDS.
- DA = 0.75 · coverage + 0.25 · (weak stages named / weak stages); DA = coverage when no stage is weak.

Specificity: is the advice tied to this question and this attempt?
- Grounding vocabulary G = content words of the question, the tool queries, the retrieved snippets (titles, and the
  first SNIPPET_CHARS characters of their text) and the final answer, minus SCAFFOLD_WORDS (words any reflection on
  any question would use: "answer", "source", "search", ...).
- Per item, grounding g = min(|content words of the item ∩ G| / GROUND_FULL, 1) with GROUND_FULL = 2.
- An item is *generic* when it matches a GENERIC_PATTERNS phrase ("be more careful", "double-check", ...) and is not
  fully grounded (g < 1). An item *parrots* the grader when the Jaccard overlap of its content words with a rubric
  justification is at least PARROT_JACCARD (0.8) and it has at least 4 content words.
- Specificity = clamp(mean g − 0.5 · generic share − 0.5 · parrot share, 0, 1).

Scope & Balance (S&B): would the guidance carry over, and is it balanced?
- count = 1 for 1–4 takeaway items (the prompt asks for 1–4), 1 − 0.25 per item beyond 4 (floor 0), 0 for none.
- categories = the share of the four rubric categories (Critical Requirement, Analytical Approach, Communication &
  Structure, Pitfalls) whose label appears in the rubrics block on a line that has at least 2 content words besides
  the label.
- distinct = 1 − (items whose cosine with an earlier item is at least REPEAT_SIM 0.85) / items.
- S&B = 0.3 · count + 0.4 · categories + 0.3 · distinct.

Known limits: it cannot tell a correct diagnosis from a fluent wrong one on the same topic, nor detect invented flaws.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from learning.errors import JudgeUnavailable
from learning.judge.aggregate import oriented_score
from learning.judge.citations import answer_text
from learning.judge.reflection import BLOCKS, reflection_reward, validity_error
from learning.judge.types import JudgeKind, Judgement, ReflectionScore, Rubric
from store.records import STAGES, Stage, Trajectory

OFFLINE_REFLECTION_MODEL = "offline-minilm-reflection"
OFFLINE_REFLECTION_VERSION = "offline-reflection-1"

SIM_LOW = 0.20
SIM_HIGH = 0.55
WEAK_STAGE = 0.5
DA_COVERAGE_WEIGHT = 0.75
GROUND_FULL = 2
GENERIC_PENALTY = 0.5
PARROT_PENALTY = 0.5
PARROT_JACCARD = 0.8
PARROT_MIN_WORDS = 4
REPEAT_SIM = 0.85
MAX_TAKEAWAYS = 4
EXTRA_TAKEAWAY_PENALTY = 0.25
SB_COUNT, SB_CATEGORIES, SB_DISTINCT = 0.3, 0.4, 0.3
MIN_ITEM_LETTERS = 3
CATEGORY_MIN_WORDS = 2
SNIPPET_CHARS = 1000
MAX_ITEMS = 40  # per candidate; a runaway candidate is cut here so embedding stays cheap

CATEGORIES: Mapping[str, re.Pattern[str]] = {
    "Critical Requirement": re.compile(r"critical\s+requirements?", re.IGNORECASE),
    "Analytical Approach": re.compile(r"analytic(?:al)?\s+approach(?:es)?", re.IGNORECASE),
    "Communication & Structure": re.compile(r"communication\s*(?:&|and)\s*structure|communication|structure",
                                            re.IGNORECASE),
    "Pitfalls": re.compile(r"pitfalls?", re.IGNORECASE),
}

STAGE_WORDS: Mapping[Stage, frozenset[str]] = {
    "plan": frozenset({"plan", "planning", "planned", "checklist", "rubric", "outline", "analysis", "decompose"}),
    "research": frozenset({"search", "searches", "searched", "query", "queries", "research", "source", "sources",
                           "evidence", "retrieve", "retrieved", "snippet", "snippets", "tool"}),
    "review": frozenset({"review", "reviewed", "verify", "verified", "verification", "check", "checked",
                         "cross-check", "confirm", "confirmed"}),
    "answer": frozenset({"answer", "report", "cite", "cited", "citation", "citations", "write", "writing", "wrote",
                         "structure", "conclusion", "final"}),
}



def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


GENERIC_PATTERNS: tuple[re.Pattern[str], ...] = tuple(re.compile(p, re.IGNORECASE) for p in (
    r"\bbe (?:more |very )?(?:careful|thorough|precise|accurate|clear|concise|rigorous)\b",
    r"\bdouble[- ]?check\b",
    r"\bpay (?:more |closer )?attention\b",
    r"\bmake sure\b",
    r"\b(?:try|work) harder\b",
    r"\bin general\b",
    r"\bimprove (?:the )?(?:quality|clarity|accuracy)\b",
    r"\bthink (?:more )?carefully\b",
    r"\bavoid (?:mistakes|errors)\b",
    r"\bdo (?:more|better) research\b",
    r"\balways (?:check|verify)\b",
))  # fmt: skip

STOPWORDS = _words("""
a about above after again against all also am an and any are as at be because been before being below between both
but by can could did do does doing down during each few for from further had has have having he her here hers him his
how i if in into is it its itself just me more most my no nor not now of off on once only or other our ours out over
own same she should so some such than that the their theirs them then there these they this those through to too
under until up very was we were what when where which while who whom why will with would you your yours use used
using one two next time way need needs make made like well much many may might must shall get got
""")

# Words every reflection on every question uses; they must not count as grounding.
SCAFFOLD_WORDS = _words(
    "answer question source search research evidence claim information careful check verify plan review structure "
    "citation cite result attempt step stage approach analytical critical requirement communication pitfall "
    "takeaway lesson guidance mistake error accuracy relevant detail specific important key clear fact data "
    "query tool output snippet report final response section point"
)

_WORD = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_BULLET = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)]|[a-z][.)])\s*", re.IGNORECASE)
_LETTERS = re.compile(r"[^\W\d_]")


def stem(word: str) -> str:
    """Crude suffix stripping so that "translations" and "translated" meet "translation" half-way."""
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 4:
            return word[: -len(suffix)]
    return word


def content_words(text: str) -> set[str]:
    """Stemmed lower-case words of 3+ characters (or numbers) that are not stopwords."""
    out: set[str] = set()
    for w in _WORD.findall(text.lower()):
        if w in STOPWORDS or (len(w) < 3 and not w.isdigit()):
            continue
        out.add(stem(w))
    return out


_SCAFFOLD_STEMS = frozenset(stem(w) for w in SCAFFOLD_WORDS)


def block_body(candidate: str, tag: str) -> str:
    """The inner text of the first `<tag>…</tag>` block, or ""."""
    m = re.search(rf"<{tag}\s*>(.*?)</{tag}\s*>", candidate, re.IGNORECASE | re.DOTALL)
    return m.group(1).strip() if m else ""


def items_of(body: str) -> list[str]:
    """The non-empty lines of a block, bullets removed, each with at least MIN_ITEM_LETTERS letters."""
    out: list[str] = []
    for line in body.splitlines():
        item = _BULLET.sub("", line).strip()
        if len(_LETTERS.findall(item)) >= MIN_ITEM_LETTERS:
            out.append(item)
    return out


def categories_covered(rubrics_body: str) -> list[str]:
    """The rubric categories whose label sits on a line with at least CATEGORY_MIN_WORDS other content words."""
    found: list[str] = []
    for name, pattern in CATEGORIES.items():
        for line in rubrics_body.splitlines():
            m = pattern.search(line)
            if m and len(content_words(line[: m.start()] + " " + line[m.end():])) >= CATEGORY_MIN_WORDS:
                found.append(name)
                break
    return found


def grounding_vocabulary(question: str, trajectory: Trajectory) -> frozenset[str]:
    """G: content words of the question, tool queries, snippets and final answer, minus SCAFFOLD_WORDS."""
    parts = [question, answer_text(trajectory)]
    for call in trajectory.tool_calls:
        parts.append(call.query)
        for s in call.snippets:
            parts.append(s.title)
            parts.append(s.text[:SNIPPET_CHARS])
    words: set[str] = set()
    for part in parts:
        words |= content_words(part)
    return frozenset(words - _SCAFFOLD_STEMS)


def _ramp(similarity: float) -> float:
    return min(1.0, max(0.0, (similarity - SIM_LOW) / (SIM_HIGH - SIM_LOW)))


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a and b else 0.0


@dataclass(frozen=True, slots=True)
class Target:
    """Something the reflection should address: a weak (or, failing that, strong) rubric, or the question."""

    text: str
    weight: float


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """What the judgement says went wrong (or right): the DA targets and the weak stages."""

    targets: tuple[Target, ...]
    weak_stages: tuple[Stage, ...]
    kind: str  # "weak rubrics" | "strong rubrics" | "question"
    justifications: tuple[str, ...]  # the grader's justifications (for the parroting check)


def _readable_id(rubric_id: str) -> str:
    return " ".join(re.split(r"[:_\-]+", rubric_id)).strip()


def _named_titles(judgement: Judgement) -> dict[str, str]:
    """Titles the judgement itself names for rubric ids (the offline trajectory judge lists its answer rubrics)."""
    names: dict[str, str] = {}
    offline = judgement.scaffold.get("offline") if isinstance(judgement.scaffold, Mapping) else None
    answer = offline.get("answer") if isinstance(offline, Mapping) else None
    listed = answer.get("rubrics") if isinstance(answer, Mapping) else None
    if isinstance(listed, list):
        for entry in listed:
            if isinstance(entry, Mapping) and isinstance(entry.get("id"), str) and isinstance(entry.get("title"), str):
                names[entry["id"]] = entry["title"]
    return names


def diagnose(question: str, judgement: Judgement, rubrics: Sequence[Rubric]) -> Diagnosis:
    """The DA targets and weak stages of a judgement (module docstring: Diagnostic Accuracy)."""
    by_id = {r.id: r for r in rubrics}
    named = _named_titles(judgement)
    weak: list[Target] = []
    strong: list[Target] = []
    justifications: list[str] = []
    weak_stages: list[Stage] = []
    for stage in STAGES:
        result = judgement.stages.get(stage)
        if result is None:
            continue
        if result.score is not None and result.score < WEAK_STAGE:
            weak_stages.append(stage)
        for rs in result.rubric_scores:
            if rs.score is None:
                continue
            rubric = by_id.get(rs.rubric_id)
            if rubric is not None:
                title, weight, oriented = rubric.title, float(rubric.weight), oriented_score(rubric, rs.score)
            else:
                title, weight, oriented = named.get(rs.rubric_id, _readable_id(rs.rubric_id)), 1.0, rs.score
            if rs.justification.strip():
                justifications.append(rs.justification.strip())
            text = f"{title}. {rs.justification.strip()}".strip(". ") if rs.justification else title
            if oriented < 2:
                weak.append(Target(text, weight * (2 - oriented) / 2))
            else:
                strong.append(Target(title, weight))
    if weak:
        return Diagnosis(tuple(weak), tuple(weak_stages), "weak rubrics", tuple(justifications))
    if strong:
        return Diagnosis(tuple(strong), tuple(weak_stages), "strong rubrics", tuple(justifications))
    return Diagnosis((Target(question, 1.0),), tuple(weak_stages), "question", tuple(justifications))


@dataclass(frozen=True, slots=True)
class _Parsed:
    rubric_items: list[str]
    takeaway_items: list[str]
    rubrics_body: str

    @property
    def items(self) -> list[str]:
        return (self.rubric_items + self.takeaway_items)[:MAX_ITEMS]


def _parse(candidate: str) -> _Parsed:
    rubrics_body = block_body(candidate, BLOCKS[0])
    return _Parsed(items_of(rubrics_body), items_of(block_body(candidate, BLOCKS[1])), rubrics_body)


class OfflineReflectionJudge:
    """Approximate reflection judge using the bundled MiniLM; see the module docstring for every formula."""

    kind: JudgeKind = "offline"
    approximate = True

    def __init__(self, embedding_model: str = "") -> None:
        """Set up the judge.

        Args:
            embedding_model: sentence-transformers model; "" = the bundled all-MiniLM-L6-v2.
        """
        self.embedding_model = embedding_model

    @property
    def model(self) -> str:
        """The judge id recorded with every score."""
        return OFFLINE_REFLECTION_MODEL

    async def score(
        self,
        question: str,
        trajectory: Trajectory,
        judgement: Judgement,
        rubrics: Sequence[Rubric],
        candidates: Sequence[str],
    ) -> list[ReflectionScore]:
        """One ReflectionScore per candidate, in order; invalid candidates get valid=False and u=None.

        Raises:
            JudgeUnavailable: the embedding model cannot be loaded (nothing was scored).
        """
        errors = [validity_error(c) for c in candidates]
        parsed = {i: _parse(c) for i, c in enumerate(candidates) if errors[i] is None}
        if not parsed:
            return [ReflectionScore(candidate=i, valid=False, error=e) for i, e in enumerate(errors)]
        diagnosis = diagnose(question, judgement, rubrics)
        texts = [t.text for t in diagnosis.targets] + [item for p in parsed.values() for item in p.items]
        vectors = await self._embed(texts)
        n_targets = len(diagnosis.targets)
        target_vecs = vectors[:n_targets]
        vocabulary = grounding_vocabulary(question, trajectory)
        justification_words = [content_words(j) for j in diagnosis.justifications]
        out: list[ReflectionScore] = []
        start = n_targets
        for i, error in enumerate(errors):
            if error is not None:
                out.append(ReflectionScore(candidate=i, valid=False, error=error))
                continue
            p = parsed[i]
            item_vecs = vectors[start : start + len(p.items)]
            start += len(p.items)
            out.append(self._score_one(i, candidates[i], p, diagnosis, target_vecs, item_vecs, vocabulary,
                                       justification_words))
        return out

    async def _embed(self, texts: list[str]) -> np.ndarray:
        from store.embeddings import EmbeddingModelError, embed_texts  # lazy: loads sentence-transformers

        try:
            vectors = await asyncio.to_thread(embed_texts, texts, self.embedding_model)
        except EmbeddingModelError as exc:
            raise JudgeUnavailable(f"the offline reflection judge cannot load its embedding model: {exc}") from exc
        return np.stack(vectors)  # (n, dim), rows L2-normalised

    @staticmethod
    def _score_one(
        index: int,
        text: str,
        p: _Parsed,
        diagnosis: Diagnosis,
        target_vecs: np.ndarray,
        item_vecs: np.ndarray,
        vocabulary: frozenset[str],
        justification_words: list[set[str]],
    ) -> ReflectionScore:
        items = p.items
        # Diagnostic accuracy
        if items:
            best = (target_vecs @ item_vecs.T).max(axis=1)  # (targets,): best cosine per target
            total = sum(t.weight for t in diagnosis.targets)
            coverage = sum(t.weight * _ramp(float(b)) for t, b in zip(diagnosis.targets, best, strict=True)) / total
        else:
            coverage = 0.0
        words = content_words(text)
        named = [s for s in diagnosis.weak_stages if words & {stem(w) for w in STAGE_WORDS[s]}]
        if diagnosis.weak_stages:
            da = DA_COVERAGE_WEIGHT * coverage + (1 - DA_COVERAGE_WEIGHT) * len(named) / len(diagnosis.weak_stages)
        else:
            da = coverage
        # Specificity
        if items:
            item_words = [content_words(item) for item in items]
            grounding = [min(len(w & vocabulary) / GROUND_FULL, 1.0) for w in item_words]
            generic = sum(
                1 for item, g in zip(items, grounding, strict=True)
                if g < 1 and any(r.search(item) for r in GENERIC_PATTERNS)
            ) / len(items)  # fmt: skip
            parrot = sum(
                1 for w in item_words
                if len(w) >= PARROT_MIN_WORDS and any(_jaccard(w, j) >= PARROT_JACCARD for j in justification_words)
            ) / len(items)  # fmt: skip
            mean_grounding = sum(grounding) / len(grounding)
        else:
            generic = parrot = mean_grounding = 0.0
        specificity = min(1.0, max(0.0, mean_grounding - GENERIC_PENALTY * generic - PARROT_PENALTY * parrot))
        # Scope & balance
        n = len(p.takeaway_items)
        count = 0.0 if n == 0 else max(0.0, 1 - EXTRA_TAKEAWAY_PENALTY * max(0, n - MAX_TAKEAWAYS))
        covered = categories_covered(p.rubrics_body)
        if items:
            sims = item_vecs @ item_vecs.T
            repeated = sum(1 for j in range(1, len(items)) if float(sims[j, :j].max()) >= REPEAT_SIM)
            distinct = 1 - repeated / len(items)
        else:
            distinct = 0.0
        scope = SB_COUNT * count + SB_CATEGORIES * len(covered) / len(CATEGORIES) + SB_DISTINCT * distinct
        da, specificity, scope = (round(min(1.0, max(0.0, v)), 6) for v in (da, specificity, scope))
        u_within, u_cross, u = reflection_reward(da, specificity, scope)
        why = (
            f"approximate (offline): DA coverage {coverage:.2f} of {len(diagnosis.targets)} {diagnosis.kind}, "
            f"weak stages named {len(named)}/{len(diagnosis.weak_stages)}; specificity grounding "
            f"{mean_grounding:.2f}, generic {generic:.2f}, parroting {parrot:.2f}; scope {n} takeaway(s), "
            f"categories {len(covered)}/4, distinct {distinct:.2f}"
        )
        return ReflectionScore(
            candidate=index, valid=True, diagnostic_accuracy=da, specificity=specificity, scope_balance=scope,
            u_within=u_within, u_cross=u_cross, u=u, justification=why,
        )
