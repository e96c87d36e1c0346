"""Pure aggregation of 0/1/2 rubric scores into a stage score R_k (METHOD §16 D3) and the answer-only fallback.

No I/O and no judge calls: the LLM judge, the offline judge and the tests all share these few functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from learning.judge.types import Rubric
from store.records import STAGES, Stage


def oriented_score(rubric: Rubric, score: int) -> int:
    """s' of D3: the raw score for a positive rubric, 2 − s for a negative one (so 0 = "avoids the flaw" counts 2).

    Raises:
        ValueError: the score is not 0, 1 or 2.
    """
    if score not in (0, 1, 2) or isinstance(score, bool):
        raise ValueError(f"a rubric score must be 0, 1 or 2, got {score!r}")
    return score if rubric.polarity == "positive" else 2 - score


def stage_score(scored: Iterable[tuple[Rubric, int | None]]) -> float | None:
    """R_k = Σ w·s' / (2·Σ w) over one stage's rubrics (D3).

    Rubrics whose score is None (the judge could not score them) are left out of both sums, so a failure never
    counts as a 0. A stage whose every rubric failed is None, and so is a stage with no rubrics at all: there is
    nothing to grade it by (METHOD open point 9; this project leaves such a stage unscored rather than inventing a
    value, and downstream treats None as "no signal for this stage").

    Args:
        scored: (rubric, score) pairs of ONE stage; score in {0, 1, 2} or None.

    Returns:
        R_k in [0, 1], or None.
    """
    numerator = 0
    denominator = 0
    for rubric, score in scored:
        if score is None:
            continue
        numerator += rubric.weight * oriented_score(rubric, score)
        denominator += rubric.weight
    if denominator == 0:
        return None
    return numerator / (2 * denominator)


def answer_only_fallback(
    scores: Mapping[Stage, float | None], answer_score: float | None
) -> tuple[dict[Stage, float | None], bool]:
    """The documented fallback when a trajectory's stagewise scoring produced nothing (METHOD §5.2 C.4, STYLE C9).

    If every stage score is None, only the Answer score is kept: `answer_score` (from an answer-only scoring call,
    or None if that failed too, in which case every stage stays None). Otherwise the scores are returned unchanged.

    Args:
        scores: R_k per stage from the stagewise scoring (missing stages count as None).
        answer_score: the Answer score from the fallback scoring, if any.

    Returns:
        (scores for all four stages, whether the fallback was applied)
    """
    full: dict[Stage, float | None] = {s: scores.get(s) for s in STAGES}
    if any(v is not None for v in full.values()):
        return full, False
    fallback: dict[Stage, float | None] = {s: None for s in STAGES}
    fallback["answer"] = answer_score
    return fallback, True
