"""The offline (approximate) judge: transparent component formulas, and one real run on the bundled MiniLM."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from learning.errors import JudgeUnavailable
from learning.judge.offline import (
    OFFLINE_MODEL,
    OfflineJudge,
    answer_sentences,
    checklist_items,
    plan_components,
    research_components,
    review_components,
    similarity_score,
)
from learning.judge.types import Rubric
from store.records import STAGES
from store.session_log import SessionLog
from tests.judge.builders import QUESTION, trajectory


def test_checklist_items_from_the_plan() -> None:
    assert checklist_items(trajectory()) == ["the language books were translated into", "the period Haymo lived in"]
    inline = "<structured_plan><rubric>Knowledge Checklist: - the language - the era</rubric></structured_plan>"
    assert checklist_items(trajectory(plan=inline)) == ["the language", "the era"]
    assert checklist_items(trajectory(plan=None)) == []


def test_plan_components() -> None:
    assert plan_components(trajectory()) == {"deep_analysis": 1.0, "rubric": 1.0, "research_plan": 1.0}
    thin = "<structured_plan><deep_analysis> </deep_analysis><research_plan>search</research_plan></structured_plan>"
    assert plan_components(trajectory(plan=thin)) == {"deep_analysis": 0.0, "rubric": 0.0, "research_plan": 1.0}


def test_research_components() -> None:
    assert research_components(trajectory(queries=())) == {"volume": 0.0, "success": 0.0, "diversity": 0.0}
    r = research_components(trajectory(queries=("a b", "A  B", "c"), tool_error=None))
    assert r == pytest.approx({"volume": 1.0, "success": 1.0, "diversity": 2 / 3})
    failing = research_components(trajectory(queries=("x",), tool_error="timeout"))
    assert failing == pytest.approx({"volume": 1 / 3, "success": 0.0, "diversity": 1.0})


def test_review_components() -> None:
    assert review_components(trajectory()) == {"rubric_review": 1.0, "writing_plan": 1.0, "cites_evidence": 1.0}
    bare = "<review><writing_plan>write</writing_plan></review>"
    assert review_components(trajectory(review=bare)) == {"rubric_review": 0.0, "writing_plan": 1.0,
                                                           "cites_evidence": 0.0}  # fmt: skip


def test_similarity_thresholds_and_sentences() -> None:
    assert [similarity_score(x) for x in (0.9, 0.55, 0.5, 0.35, 0.1, -0.2)] == [2, 2, 1, 1, 0, 0]
    t = trajectory(answer='First <cite id="a-1">claim</cite> here. Second one!\nThird\n\nok')
    assert answer_sentences(t) == ["First claim here.", "Second one!", "Third"]


@pytest.mark.slow
def test_citation_precision_counts_only_citations_whose_passage_supports_the_sentence() -> None:
    """Issue 48: citing a retrieved passage that says something else scores as a wrong citation; the id-validity
    share (`CitationCheck.precision`) still counts it."""
    true = trajectory("true")  # "Books were translated into <cite>Latin</cite>", and the passage says so
    swapped = trajectory("swapped", answer='<cite id="abcd0001-0">The Eiffel Tower opened in Paris in 1889</cite>.')
    jt, js = asyncio.run(OfflineJudge().judge_group(QUESTION, [true, swapped]))
    assert jt.citations.supported == 1 and jt.scaffold["offline"]["answer"]["citation_precision"] == 1.0
    assert js.citations.valid == 1 and js.citations.precision == 1.0  # the id names a retrieved passage ...
    assert js.citations.supported == 0 and js.scaffold["offline"]["answer"]["citation_precision"] == 0.0  # ... wrong
    cov = js.scaffold["offline"]["answer"]["coverage"]
    assert js.stage_scores()["answer"] == pytest.approx(0.7 * cov)


@pytest.mark.slow
def test_an_answer_that_only_restates_the_question_or_its_own_checklist_covers_nothing() -> None:
    """offline-3: the gate's base model once answered by repeating the question and scored Answer 0.7 on the
    question-as-rubric; echoing its own checklist was the learning curve's reward hack. Either covers nothing now,
    while the real answer still covers, and a restated gold (persistent) rubric still counts."""
    real = trajectory("real")
    echo_question = trajectory("echo-q", answer=f'To the question "{QUESTION}"')
    echo_checklist = trajectory("echo-c", answer="The language books were translated into. The period Haymo lived in.")
    judge = OfflineJudge()
    jr, jq, jc = asyncio.run(judge.judge_group(QUESTION, [real, echo_question, echo_checklist]))
    assert jr.scaffold["offline"]["answer"]["coverage"] > 0
    for j in (jq, jc):
        assert j.scaffold["offline"]["answer"]["coverage"] == 0.0, j.stages["answer"].rubric_scores
    assert all("only restates" in rs.justification for rs in jq.stages["answer"].rubric_scores)
    no_plan = trajectory("no-plan", plan=None, answer=f'To the question "{QUESTION}"')
    alone = asyncio.run(judge.judge_group(QUESTION, [no_plan]))[0]
    assert alone.scaffold["offline"]["answer"]["rubric_source"] == "question"
    assert alone.stage_scores()["answer"] == 0.0
    gold = [Rubric(id="gt-1", stage="answer", title="Says the books were translated into Latin", description="",
                   weight=1)]
    said = trajectory("said", answer="The books were translated into Latin.")
    assert asyncio.run(judge.judge_group(QUESTION, [said], gold))[0].scaffold["offline"]["answer"]["coverage"] == 1.0


def test_missing_embedding_model_raises_unavailable() -> None:
    judge = OfflineJudge(embedding_model="/nonexistent/embedding-model")
    with pytest.raises(JudgeUnavailable):
        asyncio.run(judge.judge_group(QUESTION, [trajectory()]))


@pytest.mark.slow
def test_offline_judge_on_real_text(tmp_path: Path) -> None:
    good = trajectory("good")
    bad = trajectory(
        "bad",
        answer="The weather in Paris is mild in spring, and many tourists visit museums.",
        queries=(),
        review="<review><writing_plan>write something</writing_plan></review>",
    )
    no_answer = trajectory("none", answer=None, malformed=True)
    judge = OfflineJudge()
    assert (judge.kind, judge.model, judge.approximate) == ("offline", OFFLINE_MODEL, True)
    jg, jb, jn = asyncio.run(judge.judge_group(QUESTION, [good, bad, no_answer]))

    for j in (jg, jb, jn):
        assert j.approximate and j.judge_kind == "offline" and j.judge_model == OFFLINE_MODEL
        assert set(j.stages) == set(STAGES) and j.failed_stages == 0
        assert j.scaffold["approximate"] is True
    # the agent's own checklist is the stand-in rubric set, pooled over the group
    assert jg.scaffold["offline"]["answer"]["rubric_source"] == "agent_checklist"
    s = jg.stage_scores()
    assert s["plan"] == 1.0 and s["review"] == 1.0
    assert s["research"] == pytest.approx((1 / 3 + 1 + 1) / 3)
    cov = jg.scaffold["offline"]["answer"]["coverage"]
    assert s["answer"] == pytest.approx(0.7 * cov + 0.3 * 1.0)
    language = jg.stages["answer"].rubric_scores[0]
    assert language.score == 2 and "Latin" in language.justification  # "translated into Latin" matches
    b = jb.stage_scores()
    assert b["answer"] < s["answer"] and b["research"] == 0.0 and b["review"] == pytest.approx(1 / 3)
    assert jb.citations.precision is None
    assert jn.stage_scores()["answer"] == 0.0 and "D7" in (jn.stages["answer"].error or "")

    # persistent rubrics: saved to the store when given, then used from the store
    persistent = [Rubric(id="gt-1", stage="answer", title="Says the books were translated into Latin",
                         description="", weight=3)]  # fmt: skip
    with SessionLog(tmp_path / "log.sqlite") as log:
        stored = OfflineJudge(log)
        first = asyncio.run(stored.judge_group(QUESTION, [good], persistent))[0]
        second = asyncio.run(stored.judge_group(QUESTION, [good]))[0]
    assert first.rubric_version == second.rubric_version == "1"
    assert second.scaffold["offline"]["answer"]["rubric_source"] == "persistent"
    assert [rs.rubric_id for rs in second.stages["answer"].rubric_scores] == ["gt-1"]
    assert second.stages["answer"].rubric_scores[0].score == 2
