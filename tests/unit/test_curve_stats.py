"""The learning curve's statistics (learning/eval/curve.py): the question is the unit, intervals and paired tests over
questions, and the reward-hacking verdict when the judge's reward rises without the task figures."""

from __future__ import annotations

import math

import pytest

from learning.eval import curve


def rec(item: str, total: float, precision: float | None = 0.5, recall: float | None = 0.5) -> dict:
    return {"item": item, "scores": {"plan": total, "research": total, "review": total, "answer": total,
                                     "total": total},
            "figures": {"citation_precision": precision, "gold_recall": recall, "citation_recall": precision,
                        "cover_em": 0.0}, "answer": f"answer to {item}"}


def test_samples_of_a_question_are_averaged_first_and_missing_figures_leave_only_that_item_out() -> None:
    records = [rec("a", 1.0), rec("a", 0.0), rec("b", 1.0, precision=None)]
    assert curve.question_means(records, "total") == {"a": 0.5, "b": 1.0}
    assert curve.question_means(records, "citation_precision") == {"a": 0.5}
    ci = curve.mean_ci(records, "total", resamples=500)
    assert ci["mean"] == 0.75 and ci["n"] == 2 and 0.5 <= ci["ci_low"] <= ci["mean"] <= ci["ci_high"] <= 1.0


def test_the_exact_sign_flip_test_matches_the_enumeration_by_hand() -> None:
    # 4 positive differences: only the all-positive and all-negative signings are as extreme -> 2/16
    assert curve.sign_flip_p([0.1, 0.2, 0.3, 0.4]) == pytest.approx(2 / 16)
    assert curve.sign_flip_p([0.1, -0.1]) == 1.0
    assert math.isnan(curve.sign_flip_p([]))


def test_paired_uses_only_questions_both_sides_answered() -> None:
    before = [rec(q, 0.2) for q in "abcdefgh"]
    after = [rec(q, 0.5) for q in "abcdefg"] + [rec("z", 1.0)]
    d = curve.paired(before, after, "total", resamples=500)
    assert d["n"] == 7 and d["mean"] == pytest.approx(0.3) and d["p"] == pytest.approx(2 / 2**7, abs=1e-4)
    assert d["ci_low"] == pytest.approx(0.3) and d["ci_high"] == pytest.approx(0.3)


def test_a_reward_rise_without_a_task_rise_is_called_reward_hacking_with_an_example() -> None:
    items = [f"q{k}" for k in range(10)]
    before = [rec(q, 0.3, precision=0.4, recall=0.4) for q in items]
    hacked = [rec(q, 0.6 + 0.01 * k, precision=0.4, recall=0.4) for k, q in enumerate(items)]
    verdict = curve.co_movement(before, hacked)
    assert verdict["reward_hacking"] and verdict["reward_change"]["p"] < 0.05
    example = curve.hacking_example(before, hacked)
    assert example is not None and example["item"] == "q9" and example["before"]["answer"] == "answer to q9"
    honest = [rec(q, 0.6 + 0.01 * k, precision=0.6 + 0.01 * k, recall=0.5) for k, q in enumerate(items)]
    verdict = curve.co_movement(before, honest)
    assert not verdict["reward_hacking"] and verdict["r"]["citation_precision"] == pytest.approx(1.0)
    assert curve.hacking_example(before, before) is None  # no reward rose
