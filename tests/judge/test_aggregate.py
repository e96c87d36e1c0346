"""Stage-score aggregation (METHOD D3) and the answer-only fallback, against hand-computed values."""

from __future__ import annotations

import pytest

from learning.judge.aggregate import answer_only_fallback, oriented_score, stage_score
from learning.judge.types import Rubric


def rub(weight: int, polarity: str = "positive", rid: str = "r") -> Rubric:
    return Rubric(id=rid, stage="plan", title=f"t{rid}", description="d", weight=weight, polarity=polarity)  # type: ignore[arg-type]


def test_d3_worked_example_is_075() -> None:
    # positive (w=3, s=2), positive (w=1, s=1), negative (w=2, s=1) -> (6 + 1 + 2) / 12 = 0.75
    pairs = [(rub(3), 2), (rub(1), 1), (rub(2, "negative"), 1)]
    assert stage_score(pairs) == pytest.approx(0.75)


def test_negative_rubric_is_inverted() -> None:
    assert stage_score([(rub(2, "negative"), 0)]) == 1.0  # avoids the flaw entirely
    assert stage_score([(rub(2, "negative"), 2)]) == 0.0
    assert oriented_score(rub(1, "negative"), 1) == 1
    assert oriented_score(rub(1), 2) == 2


def test_weights_matter() -> None:
    # (3*2 + 1*0) / (2*4) = 0.75 ; swapping the weights gives (1*2 + 3*0)/8 = 0.25
    assert stage_score([(rub(3), 2), (rub(1), 0)]) == pytest.approx(0.75)
    assert stage_score([(rub(1), 2), (rub(3), 0)]) == pytest.approx(0.25)


def test_failed_rubrics_are_left_out_of_both_sums() -> None:
    # Only the w=1 s=1 rubric counts: 1/2. A None must not drag the score towards 0.
    assert stage_score([(rub(3), None), (rub(1), 1)]) == pytest.approx(0.5)


def test_all_failed_or_no_rubrics_is_none() -> None:
    assert stage_score([(rub(3), None), (rub(1), None)]) is None
    assert stage_score([]) is None


def test_bad_score_is_a_typed_error() -> None:
    with pytest.raises(ValueError):
        stage_score([(rub(1), 3)])
    with pytest.raises(ValueError):
        oriented_score(rub(1), -1)


def test_fallback_keeps_only_the_answer_when_every_stage_failed() -> None:
    scores, used = answer_only_fallback({"plan": None, "research": None, "review": None, "answer": None}, 0.4)
    assert used is True
    assert scores == {"plan": None, "research": None, "review": None, "answer": 0.4}


def test_fallback_with_no_answer_score_is_all_none() -> None:
    scores, used = answer_only_fallback({"plan": None}, None)
    assert used is True
    assert set(scores) == {"plan", "research", "review", "answer"}
    assert all(v is None for v in scores.values())


def test_no_fallback_when_any_stage_scored() -> None:
    given = {"plan": None, "research": 0.5, "review": None, "answer": None}
    scores, used = answer_only_fallback(given, 0.9)
    assert used is False
    assert scores == given
