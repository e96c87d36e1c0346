"""Pure scoring maths, checked against hand-computed values."""

from __future__ import annotations

import pytest

from learning.eval.datasets import Criterion, EvalItem
from learning.eval.scoring import (
    aggregate,
    cover_em,
    exact_match,
    extract_prediction,
    grade_aggregate,
    healthbench_aggregate,
    healthbench_item_score,
    normalize_answer,
    race_scores,
    scholarqa_length_score,
    scholarqa_scores,
    scholarqa_weights,
    short_form_scores,
    support_recall,
    token_f1,
)


def test_normalisation_is_squad_style() -> None:
    assert normalize_answer("  The  Eiffel-Tower, in PARIS! ") == "eiffeltower in paris"
    assert normalize_answer("An apple a day") == "apple day"


def test_em_f1_cover_em_by_hand() -> None:
    pred, gold = "The Eiffel Tower in Paris", "Eiffel Tower"
    assert exact_match(pred, gold) == 0.0
    # pred tokens [eiffel, tower, in, paris], gold [eiffel, tower]: P = 2/4, R = 2/2, F1 = 2·0.5·1/1.5 = 2/3
    assert token_f1(pred, gold) == pytest.approx(2 / 3)
    assert cover_em(pred, gold) == 1.0
    assert exact_match("the eiffel tower.", gold) == 1.0
    # token F1 counts repeated tokens only as often as they occur in both: pred [a1 a1 b] vs gold [a1 b b]
    assert token_f1("x x y", "x y y") == pytest.approx(2 / 3)
    assert token_f1("", "") == 1.0 and token_f1("", "x") == 0.0


def test_cover_em_needs_whole_tokens() -> None:
    assert cover_em("not sure", "no") == 0.0
    assert cover_em("born in 1990", "1990") == 1.0
    assert cover_em("19901", "1990") == 0.0
    assert cover_em("anything", "") == 0.0


def test_aliases_take_the_max() -> None:
    scores = short_form_scores("Stanley Hall", ["G. Stanley Hall", "Stanley Hall"])
    assert scores == {"em": 1.0, "f1": 1.0, "cover_em": 1.0}
    only_gold = short_form_scores("Stanley Hall", ["G. Stanley Hall"])
    assert only_gold["em"] == 0.0 and only_gold["f1"] == pytest.approx(0.8) and only_gold["cover_em"] == 0.0
    assert short_form_scores("x", []) == {"em": 0.0, "f1": 0.0, "cover_em": 0.0}


def test_prediction_is_the_boxed_answer_else_the_body_without_citation_markers() -> None:
    assert extract_prediction(r"It is \boxed{a spirit} [1].") == "a spirit"
    assert extract_prediction(r"\boxed{first} then \boxed{second}") == "second"
    assert extract_prediction(r"\boxed{a spirit [2]}") == "a spirit"
    assert extract_prediction("Lilu is a spirit [1], a demon [2, 3].") == "Lilu is a spirit, a demon."


def test_support_recall() -> None:
    assert support_recall(["Alû", "Lilu (mythology)"], ["lilu (mythology)", "Other"]) == 0.5
    assert support_recall([], ["x"]) is None


def test_healthbench_item_score_with_negative_points() -> None:
    # met: +5 and -4 and +2; positive total 5+3+2 = 10 → (5 - 4 + 2) / 10
    assert healthbench_item_score([5, 3, -4, 2], [True, False, True, True]) == pytest.approx(0.3)
    assert healthbench_item_score([5, -10], [False, True]) == pytest.approx(-2.0)
    with pytest.raises(ValueError):
        healthbench_item_score([-3], [True])
    with pytest.raises(ValueError):
        healthbench_item_score([1, 2], [True])


def test_healthbench_clipped_and_unclipped_means() -> None:
    agg = healthbench_aggregate([0.3, -2.0, 1.0])
    assert agg["score_unclipped"] == pytest.approx(-0.7 / 3)
    assert agg["score"] == 0.0  # simple-evals clips the mean
    assert agg["score_item_clipped"] == pytest.approx((0.3 + 0 + 1.0) / 3)
    agg = healthbench_aggregate([0.5, 0.7])
    assert agg["score"] == agg["score_unclipped"] == pytest.approx(0.6)
    assert healthbench_aggregate([]) == {}


def test_race_arithmetic_by_hand() -> None:
    groups = ["comprehensiveness", "comprehensiveness", "insight"]
    weights = [0.6, 0.4, 1.0]
    target, reference = [8, 5, 4], [6, 10, 4]
    scores = race_scores(groups, weights, target, reference, {"comprehensiveness": 0.5, "insight": 0.5})
    # comprehensiveness: target 0.6·8 + 0.4·5 = 6.8, reference 0.6·6 + 0.4·10 = 7.6
    assert scores["comprehensiveness"] == pytest.approx(6.8 / 14.4)
    assert scores["insight"] == pytest.approx(0.5)
    # overall: ratio of the weighted totals 0.5·6.8 + 0.5·4 = 5.4 and 0.5·7.6 + 0.5·4 = 5.8 (not a mean of ratios)
    assert scores["overall"] == pytest.approx(5.4 / 11.2)
    zero = race_scores(["insight"], [1.0], [0], [0], {"insight": 1.0})
    assert zero == {"insight": 0.0, "overall": 0.0}


def _sqa_item() -> EvalItem:
    return EvalItem(
        id="c1", question="q", format="long_form",
        criteria=(
            Criterion("must 1", 0.4, group="must_have", name="most_important_item_0", evidence=("e1", "e2")),
            Criterion("nice 1", 0.2, group="nice_to_have", name="nice_to_have_item_0"),
        ),
        metadata={"low_length": 300, "high_length": 600, "length_weight": 0.05, "expertise_weight": 0.05,
                  "citations_weight": 0.2, "excerpts_weight": 0.1},
    )  # fmt: skip


def test_scholarqa_weights_split_criterion_and_evidence() -> None:
    w = scholarqa_weights(_sqa_item())
    assert w == pytest.approx({"length": 0.05, "expertise": 0.05, "citations": 0.2, "excerpts": 0.1,
                               "most_important_item_0": 0.2, "most_important_item_0_evidence": 0.2,
                               "nice_to_have_item_0": 0.2})  # fmt: skip
    assert sum(w.values()) == pytest.approx(1.0)


def test_scholarqa_score_by_hand() -> None:
    comp = {"length": 0.5, "expertise": 0.8, "citations": 1.0, "excerpts": 0.0,
            "most_important_item_0": 0.7, "most_important_item_0_evidence": 0.5, "nice_to_have_item_0": 0.0}  # fmt: skip
    s = scholarqa_scores(_sqa_item(), comp)
    # 0.05·0.5 + 0.05·0.8 + 0.2·1 + 0.1·0 + 0.2·0.7 + 0.2·0.5 + 0.2·0 = 0.505
    assert s["score"] == pytest.approx(0.505)
    assert s["ann_score"] == pytest.approx((0.14 + 0.10) / 0.6)
    assert s["must_have"] == pytest.approx(0.6) and s["nice_to_have"] == 0.0
    with pytest.raises(ValueError):
        scholarqa_scores(_sqa_item(), {"length": 1.0})


def test_scholarqa_length_score() -> None:
    assert scholarqa_length_score(100, 300, 600) == 1.0
    assert scholarqa_length_score(450, 300, 600) == pytest.approx(0.5)
    assert scholarqa_length_score(900, 300, 600) == 0.0


def test_llm_grade_aggregate_is_simpleqa_style() -> None:
    agg = grade_aggregate(["correct", "incorrect", "not_attempted", "correct"])
    assert agg["llm_accuracy"] == 0.5
    assert agg["llm_correct_given_attempted"] == pytest.approx(2 / 3)
    assert agg["llm_f1"] == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))
    assert grade_aggregate([]) == {}


def test_aggregate_skips_missing_metrics() -> None:
    metrics = [{"em": 1.0, "f1": 1.0, "support_recall": None}, {"em": 0.0, "f1": 0.5}]
    assert aggregate("short_form", metrics) == {"em": 0.5, "f1": 0.75}
    hb = aggregate("healthbench", [{"score": -1.0}, {"score": 0.5}, {}])
    assert hb["score"] == 0.0 and hb["score_unclipped"] == pytest.approx(-0.25)


def test_nested_boxed_answers_are_unwrapped() -> None:
    from learning.eval.scoring import extract_prediction, last_boxed

    assert extract_prediction(r"It is \boxed{\text{Paris}} [1].") == "Paris"
    assert last_boxed(r"\boxed{a} then \boxed{x^{2}}") == "x^{2}"
    assert last_boxed(r"\boxed{unclosed") is None and last_boxed("plain") is None
