"""The reflection judge: validity, the D8 reward, and grading through the real client against the stand-in."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from learning.errors import JudgeUnavailable
from learning.judge.client import JudgeClient
from learning.judge.reflection import ReflectionJudge, reflection_reward, render_graded_rubrics, validity_error
from learning.judge.types import Judgement, ReflectionScore, Rubric, RubricScore, StageResult
from tests.judge.builders import QUESTION, trajectory
from tests.judge.openai_standin import OpenAIStandIn, Reply

VALID = ("<reflection_rubrics>Critical Requirement: name the language with a source.</reflection_rubrics>\n"
         "<reflection_takeaways>1. Confirm the language in a second source.</reflection_takeaways>")  # fmt: skip
RUBRICS = [
    Rubric(id="r1", stage="plan", title="Identifies the era", description="d", weight=2),
    Rubric(id="r2", stage="answer", title="Unsupported claims", description="d", weight=2, polarity="negative"),
]
JUDGEMENT = Judgement(
    session_id="s1",
    question=QUESTION,
    stages={
        "plan": StageResult(stage="plan", score=0.5,
                            rubric_scores=(RubricScore(rubric_id="r1", score=1, justification="era only implied"),)),
        "research": StageResult(stage="research", score=None, error="no rubrics"),
        "review": StageResult(stage="review", score=1.0),
        "answer": StageResult(stage="answer", score=0.0,
                              rubric_scores=(RubricScore(rubric_id="r2", score=2, justification="cites a bogus id"),)),
    },
    judge_model="m",
    judge_kind="llm",
)  # fmt: skip


def test_d8_example() -> None:
    u_within, u_cross, u = reflection_reward(0.8, 0.5, 0.6)
    assert u_within == pytest.approx(0.671, abs=1e-3)
    assert u_cross == 0.6
    assert u == pytest.approx(0.636, abs=1e-3)
    assert reflection_reward(1, 1, 1) == pytest.approx((1, 1, 1))


@pytest.mark.parametrize(
    ("text", "valid"),
    [(VALID, True),
     ("<reflection_rubrics>x</reflection_rubrics>", False),
     (VALID + "\n<reflection_takeaways>again</reflection_takeaways>", False),
     ("<reflection_rubrics> </reflection_rubrics><reflection_takeaways>t</reflection_takeaways>", False),
     ("<reflection_rubrics>x<reflection_takeaways>t</reflection_takeaways>", False),
     ("plain advice: be careful", False)],
)  # fmt: skip
def test_validity(text: str, valid: bool) -> None:
    assert (validity_error(text) is None) is valid


def test_graded_rubrics_show_scores_and_justifications() -> None:
    text = render_graded_rubrics(JUDGEMENT, RUBRICS)
    assert "R = 0.50" in text and "score 1/2 — era only implied" in text
    assert "negative" in text and "cites a bogus id" in text and "R = unscored" in text


def grade(candidate: int, da: float, spec: float, sb: float) -> dict[str, Any]:
    return {"candidate": candidate, "diagnostic_accuracy": da, "specificity": spec, "scope_balance": sb,
            "justification": f"c{candidate}"}  # fmt: skip


def score(standin: OpenAIStandIn, candidates: list[str]) -> list[ReflectionScore]:
    async def go() -> list[ReflectionScore]:
        async with JudgeClient(standin.root, "judge", max_retries=0, backoff_s=0.01) as client:
            return await ReflectionJudge(client).score(QUESTION, trajectory(), JUDGEMENT, RUBRICS, candidates)

    return asyncio.run(go())


def test_grades_valid_candidates_only(openai_standin: OpenAIStandIn) -> None:
    openai_standin.push(content=json.dumps({"grades": [grade(0, 0.8, 0.5, 0.6), grade(2, 1.0, 1.0, 0.0)]}))
    out = score(openai_standin, [VALID, "no blocks at all", VALID.replace("language", "era")])
    assert [s.candidate for s in out] == [0, 1, 2]
    assert out[0].valid and out[0].u == pytest.approx(0.636, abs=1e-3) and out[0].justification == "c0"
    assert not out[1].valid and out[1].u is None and "reflection_rubrics" in (out[1].error or "")
    assert out[2].u_within == pytest.approx(1.0) and out[2].u == pytest.approx(0.5)
    (request,) = openai_standin.chat_requests
    prompt = request.json["messages"][1]["content"]
    assert "### Candidate 0" in prompt and "### Candidate 2" in prompt and "Candidate 1" not in prompt
    assert "era only implied" in prompt and "### Stage 4: Answer" in prompt


def test_no_valid_candidate_means_no_call(openai_standin: OpenAIStandIn) -> None:
    out = score(openai_standin, ["nothing", ""])
    assert [s.valid for s in out] == [False, False] and not openai_standin.chat_requests


@pytest.mark.parametrize(
    "bad",
    ["not json", json.dumps({"grades": [grade(0, 1.5, 0.5, 0.5)]}), json.dumps({"grades": [grade(7, 1, 1, 1)]}),
     json.dumps({"grades": []})],
    ids=["not-json", "out-of-range", "unknown-candidate", "empty"],
)  # fmt: skip
def test_unusable_answer_is_none_not_zero(openai_standin: OpenAIStandIn, bad: str) -> None:
    openai_standin.push(content=bad, times=2)  # the answer and the repair
    (out,) = score(openai_standin, [VALID])
    assert out.valid and out.u is None and out.diagnostic_accuracy is None
    assert "JudgeOutputInvalid" in (out.error or "")


def test_skipped_candidate_is_none(openai_standin: OpenAIStandIn) -> None:
    openai_standin.push(content=json.dumps({"grades": [grade(1, 0.5, 0.5, 0.5)]}))
    a, b = score(openai_standin, [VALID, VALID])
    assert a.u is None and "did not grade" in (a.error or "") and b.u == pytest.approx(0.5)


def test_endpoint_down_raises(openai_standin: OpenAIStandIn) -> None:
    openai_standin.responder = lambda req: Reply(status=503)
    with pytest.raises(JudgeUnavailable):
        score(openai_standin, [VALID])
