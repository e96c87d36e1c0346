"""The offline reflection judge on the real MiniLM: validity, what each dimension rewards, D8, determinism."""

from __future__ import annotations

import asyncio

import pytest

from learning.judge.offline import OfflineJudge
from learning.judge.offline_reflection import (
    OFFLINE_REFLECTION_MODEL,
    OfflineReflectionJudge,
    categories_covered,
    content_words,
    diagnose,
    items_of,
)
from learning.judge.reflection import reflection_reward
from learning.judge.types import Judgement, ReflectionScore, Rubric
from tests.judge.builders import QUESTION, trajectory
from tests.reflection.helpers import GENERIC, GOOD, RUBRICS, judgement_for


def score(candidates: list[str], judgement: Judgement | None = None,
          rubrics: tuple[Rubric, ...] = RUBRICS) -> list[ReflectionScore]:  # fmt: skip
    j = judgement if judgement is not None else judgement_for("s1")
    return asyncio.run(OfflineReflectionJudge().score(QUESTION, trajectory(), j, rubrics, candidates))


def test_invalid_candidates_are_never_scored() -> None:
    broken = GOOD.replace("</reflection_rubrics>", "")
    twice = GOOD + "\n<reflection_takeaways>again</reflection_takeaways>"
    out = score(["plain advice", broken, twice])
    assert [s.valid for s in out] == [False, False, False]
    assert all(s.u is None and s.diagnostic_accuracy is None and s.error for s in out)


def test_grounded_reflection_beats_generic_on_every_dimension() -> None:
    good, generic = score([GOOD, GENERIC])
    assert good.valid and generic.valid
    assert good.diagnostic_accuracy > generic.diagnostic_accuracy + 0.3  # type: ignore[operator]
    assert good.specificity > generic.specificity + 0.3  # type: ignore[operator]
    assert good.scope_balance > generic.scope_balance + 0.2  # type: ignore[operator]
    assert generic.specificity == 0.0  # ungrounded and generic
    assert good.u > 0.6 and generic.u < 0.4  # type: ignore[operator]
    for s in (good, generic):
        # D8 written out by hand: u_within = (0.4·DA + 0.3·Spec) / 0.7, u_cross = S&B, u = their mean.
        da, spec, sb = s.diagnostic_accuracy, s.specificity, s.scope_balance
        within = (0.4 * da + 0.3 * spec) / 0.7  # type: ignore[operator]
        assert (s.u_within, s.u_cross, s.u) == pytest.approx((within, sb, (within + sb) / 2))  # type: ignore[operator]
        assert "approximate (offline)" in s.justification


def test_reflection_reward_worked_example() -> None:
    # METHOD D8's worked example: DA 0.8, Spec 0.5, S&B 0.6 → u_within = (0.32 + 0.15) / 0.7, u = 0.636.
    assert reflection_reward(0.8, 0.5, 0.6) == pytest.approx((0.47 / 0.7, 0.6, (0.47 / 0.7 + 0.6) / 2))
    assert reflection_reward(0.8, 0.5, 0.6)[2] == pytest.approx(0.636, abs=5e-4)


def test_deterministic() -> None:
    assert score([GOOD, GENERIC]) == score([GOOD, GENERIC])


def test_diagnosis_orients_negative_rubrics() -> None:
    d = diagnose(QUESTION, judgement_for("s1"), RUBRICS)
    # r1 scored 1/2 (half weight), r2 is a negative rubric scored 2 (the flaw is present: full weight), r3 is fine.
    assert d.kind == "weak rubrics"
    assert [(t.text.split(".")[0], t.weight) for t in d.targets] == [
        ("Identifies Haymo's era", 1.0), ("Cites a snippet that was never retrieved", 2.0)]
    assert d.weak_stages == ("answer",)


def test_a_perfect_attempt_targets_its_strengths() -> None:
    j = judgement_for("s1").model_copy(update={"stages": {
        k: v.model_copy(update={"rubric_scores": tuple(r.model_copy(update={"score": 2 if r.rubric_id != "r2" else 0})
                                                       for r in v.rubric_scores), "score": 1.0})
        for k, v in judgement_for("s1").stages.items()}})  # fmt: skip
    d = diagnose(QUESTION, j, RUBRICS)
    assert d.kind == "strong rubrics" and d.weak_stages == ()
    # Without the rubric list the polarity is unknown, so a 0 counts as weak; the id stands in for the title.
    assert [t.text.split(".")[0] for t in diagnose(QUESTION, j, ()).targets] == ["r2"]
    empty = Judgement(session_id="s1", question=QUESTION, stages={}, judge_model="m", judge_kind="llm")
    assert diagnose(QUESTION, empty, ()).kind == "question"


def test_scope_counts_takeaways_categories_and_repetition() -> None:
    many = GOOD.replace("</reflection_takeaways>", "".join(
        f"{n}. Record the year of each translation into Latin for source {n}.\n" for n in range(3, 9))
        + "</reflection_takeaways>")  # fmt: skip
    repeated = GOOD.replace("2. Cite only", "2. Write Haymo's dates (d. 1244) into the plan, since the era was only "
                                            "implied.\n3. Cite only")
    good, too_many, with_repeat = score([GOOD, many, repeated])
    assert too_many.scope_balance < good.scope_balance  # type: ignore[operator]
    assert with_repeat.scope_balance < good.scope_balance  # type: ignore[operator]
    assert categories_covered(items_of.__doc__ or "") == []
    assert categories_covered("Critical Requirement: Latin for Haymo\nPitfalls:\nStructure: one cited line") == [
        "Critical Requirement", "Communication & Structure"]


def test_parroting_the_grader_costs_specificity() -> None:
    parrot = GOOD.replace("1. Write Haymo's dates (d. 1244) into the plan, since the era was only implied.",
                          "1. the era is only implied, never dated")
    good, parroted = score([GOOD, parrot])
    assert parroted.specificity < good.specificity  # type: ignore[operator]


def test_works_on_an_offline_trajectory_judgement() -> None:
    t = trajectory("s1")
    j = asyncio.run(OfflineJudge().judge_group(QUESTION, [t]))[0]
    (s,) = score([GOOD], judgement=j, rubrics=())
    assert s.valid and s.u is not None and 0 <= s.u <= 1
    assert OfflineReflectionJudge().model == OFFLINE_REFLECTION_MODEL


def test_content_words() -> None:
    assert content_words("The translations were translated in 1244") == {"translation", "translat", "1244"}
