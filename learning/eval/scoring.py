"""Benchmark scoring: pure metric functions (EM, token F1, cover-EM, HealthBench points, RACE, ScholarQA-CS rubric
weights, aggregation) and the LLM graders that call a `JsonJudge` for the rubric-scored benchmarks.

Graders never turn a failed judge call into a score: they raise `JudgeError`, and the runner records the failure.
"""

from __future__ import annotations

import asyncio
import re
import string
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from learning import prompts
from learning.errors import JudgeOutputInvalid
from learning.eval.datasets import DRB_DIMENSIONS, SQA_STATIC_WEIGHTS, BenchKind, EvalItem
from learning.judge.types import JsonJudge, Usage

# --------------------------------------------------------------------------------------------- short-form metrics

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)
_CITE_MARK = re.compile(r"\s*\[\d+(?:\s*[,–-]\s*\d+)*\]")  # the report's [n] / [1, 2] reference markers


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, drop punctuation and the articles a/an/the, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 if the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    """SQuAD token F1 between the normalised strings (two empty strings score 1, one empty string 0)."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred or not ref:
        return float(pred == ref)
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def cover_em(prediction: str, gold: str) -> float:
    """1.0 if the normalised gold answer occurs in the normalised prediction as a whole-token span.

    Token boundaries are required (a plain substring test would count gold "no" inside "not" or "1" inside "1990").
    """
    g = normalize_answer(gold)
    if not g:
        return 0.0
    return float(f" {g} " in f" {normalize_answer(prediction)} ")


def best_over_answers(metric: Callable[[str, str], float], prediction: str, answers: Sequence[str]) -> float:
    """The metric against the best-matching gold answer or alias (0.0 when there is none)."""
    return max((metric(prediction, a) for a in answers), default=0.0)


def short_form_scores(prediction: str, answers: Sequence[str]) -> dict[str, float]:
    """EM, token F1 and cover-EM of a prediction, each the max over the gold answer and its aliases."""
    return {
        "em": best_over_answers(exact_match, prediction, answers),
        "f1": best_over_answers(token_f1, prediction, answers),
        "cover_em": best_over_answers(cover_em, prediction, answers),
    }


def extract_prediction(answer_body: str) -> str:
    r"""The short answer to score: the last `\boxed{...}` content if there is one, else the whole answer body; the
    report's `[n]` citation markers are removed either way."""
    boxed = last_boxed(answer_body)
    text = boxed if boxed is not None else answer_body
    return _CITE_MARK.sub("", text).strip()


_LATEX_WRAPPER = re.compile(r"\\(?:text|mathrm|textbf|mathbf|operatorname)\{([^{}]*)\}")


def last_boxed(text: str) -> str | None:
    r"""The content of the last `\boxed{...}`, braces balanced (so `\boxed{\text{Paris}}` works), with simple
    `\text{}`-style wrappers unwrapped; None if there is none or it is unclosed."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            inner = text[i:j]
            while (unwrapped := _LATEX_WRAPPER.sub(r"\1", inner)) != inner:
                inner = unwrapped
            return inner
    return None


def support_recall(gold_titles: Sequence[str], retrieved_titles: Sequence[str]) -> float | None:
    """Fraction of the gold supporting passages (by title) among the passages retrieved in the session."""
    gold = {t.strip().lower() for t in gold_titles if t.strip()}
    if not gold:
        return None
    got = {t.strip().lower() for t in retrieved_titles}
    return len(gold & got) / len(gold)


Grade = Literal["correct", "incorrect", "not_attempted"]


def grade_aggregate(grades: Sequence[Grade]) -> dict[str, float]:
    """SimpleQA-style summary of LLM grades: accuracy (correct / all), correct given attempted, and their F1."""
    if not grades:
        return {}
    n = len(grades)
    correct = sum(g == "correct" for g in grades)
    attempted = sum(g != "not_attempted" for g in grades)
    accuracy = correct / n
    given = correct / attempted if attempted else 0.0
    f1 = 2 * accuracy * given / (accuracy + given) if accuracy + given > 0 else 0.0
    return {"llm_accuracy": accuracy, "llm_correct_given_attempted": given, "llm_f1": f1}


# ---------------------------------------------------------------------------------------------------- HealthBench


def healthbench_item_score(points: Sequence[float], met: Sequence[bool]) -> float:
    """Σ points of the met criteria (negative points included) / Σ positive points; may be < 0 (unclipped).

    Raises:
        ValueError: lengths differ, or no criterion has positive points.
    """
    if len(points) != len(met):
        raise ValueError("points and met must have the same length")
    positive = sum(p for p in points if p > 0)
    if positive <= 0:
        raise ValueError("a HealthBench item needs at least one positive-point criterion")
    return sum(p for p, m in zip(points, met, strict=True) if m) / positive


def _clip01(x: float) -> float:
    return min(1.0, max(0.0, x))


def healthbench_aggregate(item_scores: Sequence[float]) -> dict[str, float]:
    """The benchmark scores over items (METHOD §13, open point 31).

    `score` is simple-evals' released convention: the mean of the unclipped item scores, clipped to [0, 1].
    `score_unclipped` is that mean without clipping (what the papers' negative numbers imply).
    `score_item_clipped` clips each item to [0, 1] before averaging (the reading in the data's SOURCE.md).
    """
    if not item_scores:
        return {}
    mean = sum(item_scores) / len(item_scores)
    return {
        "score": _clip01(mean),
        "score_unclipped": mean,
        "score_item_clipped": sum(_clip01(s) for s in item_scores) / len(item_scores),
    }


# ------------------------------------------------------------------------------------------------------------ RACE


def race_totals(
    groups: Sequence[str], weights: Sequence[float], scores: Sequence[float], dimension_weight: Mapping[str, float]
) -> tuple[dict[str, float], float]:
    """One report's RACE numbers: per dimension the criterion-weighted mean score, and Σ_dim w_dim · mean_dim.

    Args:
        groups: the dimension of each criterion.
        weights: each criterion's weight within its dimension.
        scores: the judge's 0–10 score of each criterion for this report.
        dimension_weight: the task's weight of each dimension.
    """
    dims: dict[str, float] = {}
    for dim in dimension_weight:
        pairs = [(w, s) for g, w, s in zip(groups, weights, scores, strict=True) if g == dim]
        total_w = sum(w for w, _ in pairs)
        dims[dim] = sum(w * s for w, s in pairs) / total_w if total_w > 0 else 0.0
    return dims, sum(dimension_weight[d] * dims[d] for d in dimension_weight)


def race_scores(
    groups: Sequence[str],
    weights: Sequence[float],
    target: Sequence[float],
    reference: Sequence[float],
    dimension_weight: Mapping[str, float],
) -> dict[str, float]:
    """RACE relative scores: target / (target + reference) per dimension and overall (0.5 = on par).

    The overall score is the ratio of the weighted totals, not a mean of the dimension ratios (as in the official
    `deepresearch_bench_race.py`). A 0/0 ratio is 0, also as there.
    """
    t_dims, t_total = race_totals(groups, weights, target, dimension_weight)
    r_dims, r_total = race_totals(groups, weights, reference, dimension_weight)
    out = {d: (t_dims[d] / (t_dims[d] + r_dims[d]) if t_dims[d] + r_dims[d] > 0 else 0.0) for d in dimension_weight}
    out["overall"] = t_total / (t_total + r_total) if t_total + r_total > 0 else 0.0
    return out


# --------------------------------------------------------------------------------------------------- ScholarQA-CS


def scholarqa_length_score(words: int, low: int, high: int) -> float:
    """1 up to `low` words, falling linearly to 0 at `high` words or more (ScholarQABench's length component)."""
    clamped = max(min(high, words), low)
    return 1.0 - (clamped - low) / (high - low)


def scholarqa_weights(item: EvalItem) -> dict[str, float]:
    """Component weights of a ScholarQA-CS case: the four static components, and each rubric ingredient split in
    half between its criterion and its evidence snippets when it has both (ScholarQABench's rule). Sums to 1."""
    meta = item.metadata
    w = {k.removesuffix("_weight"): float(meta[k]) for k in SQA_STATIC_WEIGHTS}
    for c in item.criteria:
        both = bool(c.text) and bool(c.evidence)
        if c.text:
            w[c.name] = c.weight / (2.0 if both else 1.0)
        if c.evidence:
            w[f"{c.name}_evidence"] = c.weight / (2.0 if both else 1.0)
    return w


def scholarqa_scores(item: EvalItem, components: Mapping[str, float]) -> dict[str, float]:
    """The case's scores from its component scores (each in [0, 1]).

    `score` is Σ weight · component over every component. `ann_score` is the rubric-ingredient part alone,
    normalised by the ingredients' total weight. `must_have` / `nice_to_have` are the same within each class.
    """
    weights = scholarqa_weights(item)
    missing = set(weights) - set(components)
    if missing:
        raise ValueError(f"missing component scores: {sorted(missing)}")
    out = {"score": sum(weights[k] * components[k] for k in weights)}
    static = {k.removesuffix("_weight") for k in SQA_STATIC_WEIGHTS}
    for label, keep in (("ann_score", None), ("must_have", "must_have"), ("nice_to_have", "nice_to_have")):
        names = {c.name for c in item.criteria if keep is None or c.group == keep}
        keys = [k for k in weights if k not in static and k.removesuffix("_evidence") in names]
        total = sum(weights[k] for k in keys)
        if total > 0:
            out[label] = sum(weights[k] * components[k] for k in keys) / total
    for k in static:
        out[k] = components[k]
    return out


# ------------------------------------------------------------------------------------------------------ aggregation


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def aggregate(kind: BenchKind, metrics: Sequence[Mapping[str, Any]], grades: Sequence[Grade] = ()) -> dict[str, float]:
    """Benchmark-level numbers from the per-item metric dicts of the scored items (None values are skipped)."""
    if kind == "healthbench":
        return healthbench_aggregate([m["score"] for m in metrics if m.get("score") is not None])
    keys = list(dict.fromkeys(k for m in metrics for k in m))
    out: dict[str, float] = {}
    for k in keys:
        mean = _mean([float(m[k]) for m in metrics if isinstance(m.get(k), int | float)])
        if mean is not None:
            out[k] = mean
    if kind == "short_form":
        out.pop("llm_correct", None)  # replaced by the SimpleQA-style triple
        out.update(grade_aggregate(grades))
    return out


PRIMARY_METRIC: dict[BenchKind, str] = {
    "short_form": "f1",
    "healthbench": "score",
    "deep_research_bench": "overall",
    "scholarqa_cs": "score",
    "rubric_pairs": "rubric",
}

# ---------------------------------------------------------------------------------------------------- LLM graders

EVAL_TEMPLATES = (
    "eval_shortform_grade", "eval_healthbench_criterion", "eval_race",
    "eval_sqa_property", "eval_sqa_evidence", "eval_sqa_citations",
)  # fmt: skip
MAX_RESPONSE_CHARS = 24_000  # the answer shown to a grader
MAX_REFERENCE_CHARS = 40_000  # the DRB reference article shown to the RACE grader
SQA_EXPERTISE_CRITERION = (
    "The level of expertise needed to understand the answer should roughly match the expertise of a typical person "
    "who would ask this question."
)


def grader_prompt_version() -> str:
    """A short hash of the eval grader templates and the judge system message (recorded in the summary)."""
    # rubric-pairs items are graded by DeepRubric's criteria prompt (learning/deeprubric/scorer.py): hashed too.
    return prompts.templates_version((*EVAL_TEMPLATES, "deeprubric_criteria"))


@dataclass(frozen=True, slots=True)
class Graded:
    """What an LLM grader found for one item: metrics for the summary, details for the JSONL, judge usage."""

    metrics: dict[str, float]
    details: dict[str, Any] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    grade: Grade | None = None


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "\n[… truncated]"


class _ShortGrade(BaseModel):
    model_config = ConfigDict(extra="ignore")
    explanation: str = ""
    grade: Grade


class _CriterionMet(BaseModel):
    model_config = ConfigDict(extra="ignore")
    explanation: str = ""
    criteria_met: bool


class _Score10(BaseModel):
    model_config = ConfigDict(extra="ignore")
    score: float = Field(ge=0, le=10)


class _EvidenceCount(BaseModel):
    model_config = ConfigDict(extra="ignore")
    relevant_count: int = Field(ge=0)


class _Citation(BaseModel):
    model_config = ConfigDict(extra="ignore")
    citation_text: str = ""
    excerpts: list[str] = Field(default_factory=list)


class _Claim(BaseModel):
    model_config = ConfigDict(extra="ignore")
    claim_text: str = ""
    citations: list[_Citation] = Field(default_factory=list)


class _Claims(BaseModel):
    model_config = ConfigDict(extra="ignore")
    claims: list[_Claim]


class _RaceEntry(BaseModel):
    model_config = ConfigDict(extra="ignore")
    index: int
    article_1_score: float = Field(ge=0, le=10)
    article_2_score: float = Field(ge=0, le=10)


# JSON schemas sent as the response format. They avoid keywords some strict-mode endpoints refuse (minimum/maximum);
# ranges are enforced by the pydantic models above, and a violation triggers the client's one repair request.
_SCHEMAS: dict[str, dict[str, Any]] = {
    "eval_shortform_grade": {
        "type": "object",
        "properties": {"explanation": {"type": "string"},
                       "grade": {"type": "string", "enum": ["correct", "incorrect", "not_attempted"]}},
        "required": ["explanation", "grade"], "additionalProperties": False,
    },
    "eval_healthbench_criterion": {
        "type": "object",
        "properties": {"explanation": {"type": "string"}, "criteria_met": {"type": "boolean"}},
        "required": ["explanation", "criteria_met"], "additionalProperties": False,
    },
    "eval_sqa_property": {
        "type": "object", "properties": {"score": {"type": "number"}},
        "required": ["score"], "additionalProperties": False,
    },
    "eval_sqa_evidence": {
        "type": "object", "properties": {"relevant_count": {"type": "integer"}},
        "required": ["relevant_count"], "additionalProperties": False,
    },
    "eval_sqa_citations": {
        "type": "object",
        "properties": {"claims": {"type": "array", "items": {
            "type": "object",
            "properties": {
                "claim_text": {"type": "string"},
                "citations": {"type": "array", "items": {
                    "type": "object",
                    "properties": {"citation_text": {"type": "string"},
                                   "excerpts": {"type": "array", "items": {"type": "string"}}},
                    "required": ["citation_text", "excerpts"], "additionalProperties": False,
                }},
            },
            "required": ["claim_text", "citations"], "additionalProperties": False,
        }}},
        "required": ["claims"], "additionalProperties": False,
    },
}  # fmt: skip

_RACE_ENTRY_SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"index": {"type": "integer"},
                       "article_1_score": {"type": "number"},
                       "article_2_score": {"type": "number"}},
        "required": ["index", "article_1_score", "article_2_score"], "additionalProperties": False,
    },
}  # fmt: skip
_SCHEMAS["eval_race"] = {
    "type": "object",
    "properties": {d: _RACE_ENTRY_SCHEMA for d in DRB_DIMENSIONS},
    "required": list(DRB_DIMENSIONS),
    "additionalProperties": False,
}


async def _ask(judge: JsonJudge, template: str, validate: Callable[[Any], Any], **variables: str) -> tuple[Any, Usage]:
    """One judge call; the answer is validated by `validate` (again here, in case a judge returns raw JSON)."""
    call = await judge.complete_json(
        prompts.messages(template, **variables), _SCHEMAS[template], name=template, validate=validate
    )
    try:
        data = validate(call.data)
    except (ValidationError, ValueError, TypeError) as exc:
        raise JudgeOutputInvalid(f"{template}: the judge's answer has the wrong shape: {exc}") from exc
    return data, call.usage


def _model(cls: type[BaseModel]) -> Callable[[Any], Any]:
    return lambda data: data if isinstance(data, cls) else cls.model_validate(data)


async def _gather(calls: Sequence[Any]) -> list[Any]:
    """Run judge calls concurrently (the client bounds concurrency); the first judge failure is raised after all
    have finished, so no call is left running."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return list(results)


async def grade_short_form(judge: JsonJudge, item: EvalItem, prediction: str) -> Graded:
    """The LLM's correct / incorrect / not-attempted grade of a short answer against the gold answer(s)."""
    data, usage = await _ask(
        judge, "eval_shortform_grade", _model(_ShortGrade),
        question=item.question, answers=" | ".join(item.answers), prediction=prediction or "(no answer)",
    )  # fmt: skip
    return Graded(
        {"llm_correct": float(data.grade == "correct")},
        {"grade": data.grade, "explanation": data.explanation},
        usage,
        data.grade,
    )


async def grade_healthbench(judge: JsonJudge, item: EvalItem, response: str) -> Graded:
    """One judge call per rubric criterion (simple-evals' design); the item score is unclipped."""
    conversation = (
        "\n\n".join(f"{m['role']}: {m['content']}" for m in item.metadata.get("messages", ())) or item.question
    )
    calls = [
        _ask(judge, "eval_healthbench_criterion", _model(_CriterionMet), conversation=conversation,
             response=_cut(response, MAX_RESPONSE_CHARS), points=f"{c.weight:g}", criterion=c.text)
        for c in item.criteria
    ]  # fmt: skip
    results = await _gather(calls)
    met = [bool(d.criteria_met) for d, _ in results]
    usage = sum((u for _, u in results), Usage())
    score = healthbench_item_score([c.weight for c in item.criteria], met)
    details = {"criteria": [
        {"points": c.weight, "met": m, "explanation": d.explanation, "criterion": c.text[:300]}
        for c, m, (d, _) in zip(item.criteria, met, results, strict=True)
    ]}  # fmt: skip
    return Graded({"score": score}, details, usage)


def _race_validator(item: EvalItem) -> Callable[[Any], dict[str, list[_RaceEntry]]]:
    counts = {d: sum(1 for c in item.criteria if c.group == d) for d in DRB_DIMENSIONS}

    def validate(data: Any) -> dict[str, list[_RaceEntry]]:
        if not isinstance(data, dict):
            raise TypeError("expected a JSON object keyed by dimension")
        out: dict[str, list[_RaceEntry]] = {}
        for dim, n in counts.items():
            raw = data.get(dim)
            if not isinstance(raw, list):
                raise TypeError(f"missing the list for dimension {dim!r}")
            entries = [e if isinstance(e, _RaceEntry) else _RaceEntry.model_validate(e) for e in raw]
            by_index = {e.index: e for e in entries}
            if sorted(by_index) != list(range(1, n + 1)):
                raise ValueError(f"{dim}: expected one entry for each index 1..{n}, got {sorted(by_index)}")
            out[dim] = [by_index[i] for i in range(1, n + 1)]
        return out

    return validate


def _race_criteria_text(item: EvalItem) -> str:
    lines = []
    for dim in DRB_DIMENSIONS:
        lines.append(f"## {dim}")
        for i, c in enumerate((c for c in item.criteria if c.group == dim), 1):
            lines.append(f"{i}. {c.text}" + (f" — {c.explanation}" if c.explanation else ""))
    return "\n".join(lines)


async def grade_race(judge: JsonJudge, item: EvalItem, article: str) -> Graded:
    """RACE: one call scores the target (article_1) and the reference (article_2) on every criterion, 0–10."""
    data, usage = await _ask(
        judge, "eval_race", _race_validator(item), task=item.question,
        article_1=_cut(article, MAX_RESPONSE_CHARS), article_2=_cut(item.reference, MAX_REFERENCE_CHARS),
        criteria=_race_criteria_text(item),
    )  # fmt: skip
    groups, weights, target, reference = [], [], [], []
    for dim in DRB_DIMENSIONS:
        crit = [c for c in item.criteria if c.group == dim]
        for c, e in zip(crit, data[dim], strict=True):
            groups.append(dim)
            weights.append(c.weight)
            target.append(e.article_1_score)
            reference.append(e.article_2_score)
    scores = race_scores(groups, weights, target, reference, item.metadata["dimension_weight"])
    details = {
        "target_scores": target,
        "reference_scores": reference,
        "reference_source": item.metadata.get("reference_source", ""),
    }
    return Graded(scores, details, usage)


async def grade_scholarqa(judge: JsonJudge, item: EvalItem, report_markdown: str, answer_body: str) -> Graded:
    """ScholarQABench's rubric score: length, expertise, citations, excerpts and each ingredient (criterion 0–10 and
    evidence-snippet coverage; the evidence is only checked when the criterion scored above 0, as upstream)."""
    meta = item.metadata
    response = _cut(report_markdown, MAX_RESPONSE_CHARS)
    comp: dict[str, float] = {
        "length": scholarqa_length_score(len(answer_body.split()), meta["low_length"], meta["high_length"])
    }

    def prop(text: str) -> Any:
        return _ask(
            judge, "eval_sqa_property", _model(_Score10), question=item.question, response=response, criterion=text
        )

    with_text = [c for c in item.criteria if c.text]
    first = await _gather([
        prop(SQA_EXPERTISE_CRITERION),
        _ask(judge, "eval_sqa_citations", _model(_Claims), response=response),
        *(prop(c.text) for c in with_text),
    ])  # fmt: skip
    usage = sum((u for _, u in first), Usage())
    comp["expertise"] = first[0][0].score / 10.0
    claims: _Claims = first[1][0]
    comp["citations"] = sum(1 for cl in claims.claims if cl.citations) / max(len(claims.claims), 1)
    cites = [ct for cl in claims.claims for ct in cl.citations]
    comp["excerpts"] = sum(1 for ct in cites if ct.excerpts) / max(len(cites), 1)
    for c, (d, _) in zip(with_text, first[2:], strict=True):
        comp[c.name] = d.score / 10.0
    need_evidence = [c for c in item.criteria if c.evidence and (not c.text or comp.get(c.name, 0.0) > 0)]
    evidence = await _gather([
        _ask(judge, "eval_sqa_evidence", _model(_EvidenceCount), response=response, count=str(len(c.evidence)),
             snippets="\n".join(f"{i}. {e}" for i, e in enumerate(c.evidence, 1)))
        for c in need_evidence
    ])  # fmt: skip
    usage = sum((u for _, u in evidence), usage)
    for c, (d, _) in zip(need_evidence, evidence, strict=True):
        comp[f"{c.name}_evidence"] = min(d.relevant_count / len(c.evidence), 1.0)
    for c in item.criteria:
        if c.evidence:
            comp.setdefault(f"{c.name}_evidence", 0.0)  # criterion scored 0: its evidence is not credited (upstream)
    return Graded(scholarqa_scores(item, comp), {"components": comp, "claims": len(claims.claims)}, usage)
