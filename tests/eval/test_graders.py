"""LLM graders through the real JudgeClient against an OpenAI-compatible stand-in server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from learning.errors import JudgeOutputInvalid
from learning.eval.datasets import Criterion, EvalItem
from learning.eval.scoring import (
    EVAL_TEMPLATES,
    grade_healthbench,
    grade_race,
    grade_scholarqa,
    grade_short_form,
    grader_prompt_version,
    race_scores,
)
from learning.judge.client import JudgeClient
from learning.prompts import placeholders
from tests.eval.support import user_prompt
from tests.judge.openai_standin import OpenAIStandIn

T = TypeVar("T")


def judged(standin: OpenAIStandIn, grader: Callable[[JudgeClient], Awaitable[T]]) -> T:
    """Run one grader with a fresh client on its own event loop."""

    async def go() -> T:
        async with JudgeClient(standin.root, "standin-judge", max_retries=0, backoff_s=0.01) as judge:
            return await grader(judge)

    return asyncio.run(go())


@pytest.mark.parametrize(
    ("prediction", "grade", "correct"),
    [("A spirit.", "correct", 1.0), ("A demon.", "incorrect", 0.0), ("", "not_attempted", 0.0)],
)
def test_short_form_grade(standin: OpenAIStandIn, prediction: str, grade: str, correct: float) -> None:
    item = EvalItem("1", "If Gallu is a demon Lilu is what?", "exact_answer", answers=("a spirit", "spirit"))

    def respond(req: dict[str, Any]) -> str:  # a judge that grades what the prompt it was sent says
        prompt = user_prompt(req)
        said = "not_attempted" if "(no answer)" in prompt else "correct" if "A spirit." in prompt else "incorrect"
        return json.dumps({"explanation": "compared", "grade": said})

    standin.responder = respond
    graded = judged(standin, lambda j: grade_short_form(j, item, prediction))
    assert graded.metrics == {"llm_correct": correct} and graded.grade == grade
    assert graded.usage.calls == 1 and graded.usage.prompt_tokens > 0
    req = standin.chat_requests[0].json
    assert req["response_format"]["json_schema"]["name"] == "eval_shortform_grade"
    assert "a spirit | spirit" in user_prompt(req)


def test_short_form_grade_outside_the_schema_is_invalid_judge_output(standin: OpenAIStandIn) -> None:
    item = EvalItem("1", "If Gallu is a demon Lilu is what?", "exact_answer", answers=("a spirit",))
    standin.push(content=json.dumps({"explanation": "hm", "grade": "mostly"}), times=2)  # the answer and its repair
    with pytest.raises(JudgeOutputInvalid):
        judged(standin, lambda j: grade_short_form(j, item, "A spirit."))
    assert len(standin.chat_requests) == 2


def test_healthbench_one_call_per_criterion_with_negative_points(standin: OpenAIStandIn) -> None:
    item = EvalItem("h1", "my knee hurts", "short_form", criteria=(
        Criterion("Advises rest", 5.0), Criterion("Mentions red flags", 3.0), Criterion("Recommends opioids", -4.0),
    ), metadata={"messages": [{"role": "user", "content": "my knee hurts"}]})  # fmt: skip

    def respond(req: dict[str, Any]) -> str:
        prompt = user_prompt(req)
        met = 'points="5"' in prompt or 'points="-4"' in prompt
        return json.dumps({"explanation": "checked", "criteria_met": met})

    standin.responder = respond
    graded = judged(standin, lambda j: grade_healthbench(j, item, "Rest it; opioids help."))
    assert graded.metrics["score"] == pytest.approx((5 - 4) / 8)
    assert [c["met"] for c in graded.details["criteria"]] == [True, False, True]
    assert len(standin.chat_requests) == 3


def _drb_item() -> EvalItem:
    crit = (
        Criterion("Covers A", 0.7, group="comprehensiveness"), Criterion("Covers B", 0.3, group="comprehensiveness"),
        Criterion("Deep", 1.0, group="insight"), Criterion("Follows task", 1.0, group="instruction_following"),
        Criterion("Clear", 1.0, group="readability"),
    )  # fmt: skip
    weights = {"comprehensiveness": 0.4, "insight": 0.3, "instruction_following": 0.2, "readability": 0.1}
    return EvalItem(
        "7",
        "Research X",
        "short_form",
        criteria=crit,
        reference="Reference report.",
        metadata={"dimension_weight": weights},
    )


RACE_ANSWER = {
    "comprehensiveness": [{"index": 2, "article_1_score": 4, "article_2_score": 8},
                          {"index": 1, "article_1_score": 6, "article_2_score": 6}],
    "insight": [{"index": 1, "article_1_score": 5, "article_2_score": 5}],
    "instruction_following": [{"index": 1, "article_1_score": 9, "article_2_score": 3}],
    "readability": [{"index": 1, "article_1_score": 2, "article_2_score": 8}],
}  # fmt: skip


def test_race_scores_target_against_reference(standin: OpenAIStandIn) -> None:
    item = _drb_item()
    standin.push(content=json.dumps(RACE_ANSWER))
    graded = judged(standin, lambda j: grade_race(j, item, "Our report [1]."))
    expected = race_scores(
        [c.group for c in item.criteria], [c.weight for c in item.criteria],
        [6, 4, 5, 9, 2], [6, 8, 5, 3, 8], item.metadata["dimension_weight"],
    )  # fmt: skip
    assert graded.metrics == pytest.approx(expected)
    # comprehensiveness by hand: target 0.7·6 + 0.3·4 = 5.4, reference 0.7·6 + 0.3·8 = 6.6
    assert graded.metrics["comprehensiveness"] == pytest.approx(5.4 / 12.0)
    prompt = user_prompt(standin.chat_requests[0].json)
    assert "<article_1>\nOur report [1].\n</article_1>" in prompt and "Reference report." in prompt
    assert "## comprehensiveness\n1. Covers A\n2. Covers B" in prompt


def test_race_incomplete_answer_is_an_error_after_one_repair(standin: OpenAIStandIn) -> None:
    partial = {**RACE_ANSWER, "insight": []}
    standin.push(content=json.dumps(partial), times=2)
    with pytest.raises(JudgeOutputInvalid, match="insight"):
        judged(standin, lambda j: grade_race(j, _drb_item(), "Our report."))
    assert len(standin.chat_requests) == 2  # the answer and the one repair request


def test_scholarqa_components(standin: OpenAIStandIn) -> None:
    item = EvalItem("c1", "Which datasets evaluate type inference?", "long_form", criteria=(
        Criterion("Lists ManyTypes4Py", 0.4, group="must_have", name="most_important_item_0", evidence=("e1", "e2")),
        Criterion("Explains methods", 0.2, group="nice_to_have", name="nice_to_have_item_0", evidence=("e3",)),
    ), metadata={"low_length": 300, "high_length": 600, "length_weight": 0.05, "expertise_weight": 0.05,
                 "citations_weight": 0.2, "excerpts_weight": 0.1})  # fmt: skip
    claims = {"claims": [
        {"claim_text": "a", "citations": [{"citation_text": "[1]", "excerpts": ["quote"]}]},
        {"claim_text": "b", "citations": [{"citation_text": "[2]", "excerpts": []}]},
        {"claim_text": "c", "citations": []},
        {"claim_text": "d", "citations": []},
    ]}  # fmt: skip

    def respond(req: dict[str, Any]) -> str:
        prompt = user_prompt(req)
        if "Split the response into its individual claims" in prompt:
            return json.dumps(claims)
        if "numbered snippets" in prompt:
            return json.dumps({"relevant_count": 1})
        if "ManyTypes4Py" in prompt:
            return json.dumps({"score": 8})
        if "Explains methods" in prompt:
            return json.dumps({"score": 0})
        return json.dumps({"score": 6})  # the expertise criterion

    standin.responder = respond
    graded = judged(standin, lambda j: grade_scholarqa(j, item, "# Q\n\nBody [1].\n\n## References", "word " * 450))
    comp = graded.details["components"]
    assert comp["length"] == pytest.approx(0.5) and comp["expertise"] == pytest.approx(0.6)
    assert comp["citations"] == pytest.approx(0.5) and comp["excerpts"] == pytest.approx(0.5)
    assert comp["most_important_item_0"] == pytest.approx(0.8)
    assert comp["most_important_item_0_evidence"] == pytest.approx(0.5)
    # criterion scored 0: its evidence is not checked and earns nothing (ScholarQABench's rule)
    assert comp["nice_to_have_item_0"] == 0.0 and comp["nice_to_have_item_0_evidence"] == 0.0
    evidence_calls = [r for r in standin.chat_requests if "numbered snippets" in user_prompt(r.json)]
    assert len(evidence_calls) == 1
    expected = 0.05 * 0.5 + 0.05 * 0.6 + 0.2 * 0.5 + 0.1 * 0.5 + 0.2 * 0.8 + 0.2 * 0.5
    assert graded.metrics["score"] == pytest.approx(expected)
    assert graded.metrics["must_have"] == pytest.approx((0.2 * 0.8 + 0.2 * 0.5) / 0.4)


def test_grader_templates_exist_and_are_versioned() -> None:
    assert all(name.startswith("eval_") and placeholders(name) for name in EVAL_TEMPLATES)
    version = grader_prompt_version()
    assert len(version) == 16 and version == grader_prompt_version()
