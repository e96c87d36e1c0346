"""The stagewise LLM judge through the real JudgeClient against the local OpenAI-format stand-in.

Well-formed rounds are checked against hand-computed R_k; every broken-judge case (not JSON, wrong shape, scores out
of range, empty lists, 500s, timeouts) must end in Judgements with None scores and counts, never an exception, except
JudgeUnavailable / JudgeRequestError when nothing could be judged at all.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from learning.errors import JudgeRequestError, JudgeUnavailable
from learning.judge.buffer import RubricBuffer, load_buffer
from learning.judge.client import JudgeClient
from learning.judge.llm import ABSENT_NOTE, LLMJudge, ScoredGroup, render_trajectory
from learning.judge.types import Rubric
from learning.prompts import prompt_version
from store.records import STAGES
from store.session_log import SessionLog
from tests.judge.builders import QUESTION, trajectory
from tests.judge.openai_standin import OpenAIStandIn, Reply

PERSISTENT = Rubric(id="gt-1", stage="answer", title="Names Latin", description="says Latin", weight=3)

GENERATION = {
    "stage_1": {"positive_rubrics": [{"title": "Identifies the era", "description": "d", "weight": 2}],
                "negative_rubrics": []},
    "stage_2": {"positive_rubrics": [{"title": "Specific queries", "description": "d", "weight": 3},
                                     {"title": "Confirms with a second source", "description": "d", "weight": 1},
                                     {"title": "Stops when answered", "description": "d", "weight": 1},
                                     {"title": "Pivots on evidence", "description": "d", "weight": 2}],
                "negative_rubrics": []},
    "stage_3": {"positive_rubrics": [{"title": "Honest gaps", "description": "d", "weight": 2}], "negative_rubrics": []},
    "stage_4": {"positive_rubrics": [{"title": "Correct language", "description": "d", "weight": 3}],
                "negative_rubrics": [{"title": "Unsupported claims", "description": "d", "weight": 2}]},
}  # fmt: skip
EMPTY_GENERATION = {f"stage_{i}": {"positive_rubrics": [], "negative_rubrics": []} for i in range(1, 5)}

# title -> score for variants A, B, C
SCORES = {
    "Identifies the era": {"A": 2, "B": 1, "C": 2},
    "Specific queries": {"A": 2, "B": 0, "C": 1},
    "Confirms with a second source": {"A": 0, "B": 0, "C": 0},
    "Stops when answered": {"A": 1, "B": 1, "C": 2},
    "Pivots on evidence": {"A": 2, "B": 0, "C": 0},
    "Honest gaps": {"A": 2, "B": 1, "C": 2},
    "Correct language": {"A": 2, "B": 0, "C": 2},
    "Unsupported claims": {"A": 0, "B": 2, "C": 1},
    "Names Latin": {"A": 2, "B": 0, "C": 2},
}
_RUBRIC_LINE = re.compile(r"^\[(\d+)\] Stage \d \(\w+\) · [\w ]+ · weight \d · (.+?): ", re.MULTILINE)


def group() -> list:
    return [
        trajectory("sa", answer='Books were translated into <cite id="abcd0001-0">Latin</cite> (variant A).'),
        trajectory("sb", answer='They used <cite id="deadbeef-1">Greek</cite> (variant B).'),
        trajectory("sc", answer='Into <cite id="abcd0001-0">Latin</cite> (variant C).', review=None, malformed=True),
    ]


def name_of(req: dict[str, Any]) -> str:
    return req["response_format"]["json_schema"]["name"]


def variant_of(req: dict[str, Any]) -> str:
    return re.search(r"\(variant ([ABC])\)", req["messages"][1]["content"]).group(1)


def scorer(req: dict[str, Any], omit: set[str] = frozenset()) -> str:  # type: ignore[assignment]
    prompt = req["messages"][1]["content"]
    v = variant_of(req)
    scores = [
        {"index": int(i), "score": SCORES[title][v], "justification": f"{title} for {v}"}
        for i, title in _RUBRIC_LINE.findall(prompt)
        if title not in omit
    ]
    return json.dumps({"scores": scores})


def responder(
    generation: dict | str = GENERATION, score: Callable[[dict], str | Reply] = scorer
) -> Callable[[dict], str | Reply]:
    def respond(req: dict[str, Any]) -> str | Reply:
        if name_of(req) == "rubric_generation":
            return generation if isinstance(generation, str) else json.dumps(generation)
        return score(req)

    return respond


# Timeouts are tested with held replies (answered only after the test), so a timeout is certain to fire; its value only
# has to leave the answered requests ample time on a loaded machine.
TIMEOUT_S = 2.0


def client_for(standin: OpenAIStandIn, **kw: Any) -> JudgeClient:
    kw.setdefault("max_retries", 0)
    return JudgeClient(standin.root, "standin-judge", backoff_s=0.01, backoff_max_s=0.02, **kw)


def run(standin: OpenAIStandIn, store: SessionLog | None = None, trajs: list | None = None,
        persistent: tuple = (PERSISTENT,), **client_kw: Any) -> ScoredGroup:  # fmt: skip
    async def go() -> ScoredGroup:
        async with client_for(standin, **client_kw) as client:
            return await LLMJudge(client, store).score_group(QUESTION, trajs or group(), persistent)

    return asyncio.run(go())


@pytest.fixture
def log(tmp_path: Path):
    with SessionLog(tmp_path / "log.sqlite") as opened:
        yield opened


def test_well_formed_round(openai_standin: OpenAIStandIn, log: SessionLog) -> None:
    openai_standin.responder = responder()
    trajs = group()
    result = run(openai_standin, log, trajs)
    a, b, c = result.judgements
    assert [j.session_id for j in result.judgements] == ["sa", "sb", "sc"]

    expected = {
        "sa": {"plan": 1.0, "research": 11 / 14, "review": 1.0, "answer": 1.0},
        "sb": {"plan": 0.5, "research": 1 / 14, "review": 0.5, "answer": 0.0},
        "sc": {"plan": 1.0, "research": 5 / 14, "review": 0.0, "answer": 14 / 16},  # review absent: D7 zero
    }
    for j in result.judgements:
        assert set(j.stages) == set(STAGES)
        assert j.stage_scores() == pytest.approx(expected[j.session_id])
        assert j.judge_kind == "llm" and j.judge_model == "standin-judge" and not j.approximate
        assert j.prompt_version == prompt_version() and j.rubric_version == "1"
        assert j.failed_stages == 0 and not j.fallback_answer_only
        assert j.scaffold["rubric_generation"] == "ok" and j.scaffold["new_rubrics"] == 8
    assert "D7" in (c.stages["review"].error or "") and c.stages["review"].rubric_scores == ()
    assert c.scaffold["absent_stages"] == ["review"]

    # raw scores and justifications are kept per rubric
    ids = {r.title: r.id for r in result.rubrics}
    by_id = {rs.rubric_id: rs for rs in a.stages["answer"].rubric_scores}
    assert by_id["gt-1"].score == 2 and by_id[ids["Unsupported claims"]].justification == "Unsupported claims for A"
    assert (a.citations.cited, a.citations.valid, b.citations.precision) == (1, 1, 0.0)

    # usage: 1 generation + 3 scoring calls; the generation's cost is on the first judgement
    assert result.usage.calls == 4
    assert a.usage.calls == 2 and b.usage.calls == 1 and c.usage.calls == 1

    # pruning: the flat rubric is retired, research keeps the two most discriminative of the rest
    assert result.prune.zero_variance == (ids["Confirms with a second source"],)
    assert result.prune.over_cap == (ids["Stops when answered"],)
    saved = load_buffer(log, QUESTION)
    assert saved == result.buffer and saved.version == "1"
    assert [r.title for r in saved.active["research"]] == ["Specific queries", "Pivots on evidence"]
    assert saved.persistent[0].id == "gt-1"
    assert all(saved.size(s) <= cap for s, cap in zip(STAGES, (3, 2, 2, 3), strict=True))

    # one generation call saw all three attempts, the persistent rubric, and (cut) tool output
    gen = [r for r in openai_standin.chat_requests if name_of(r.json) == "rubric_generation"]
    assert len(gen) == 1
    gen_prompt = gen[0].json["messages"][1]["content"]
    assert gen_prompt.count("=== Attempt") == 3 and "Names Latin" in gen_prompt and "<tool_output>" in gen_prompt
    # the malformed trajectory's scoring prompt does not list review rubrics
    c_prompt = next(
        r.json["messages"][1]["content"]
        for r in openai_standin.chat_requests
        if name_of(r.json) == "stage_scoring" and "(variant C)" in r.json["messages"][1]["content"]
    )
    assert "Honest gaps" not in c_prompt and "Stage 3 (Review)" not in c_prompt

    # the inputs were not mutated
    assert trajs == group()

    # a second round loads the buffer, shows it to the generator, and saves version 2
    openai_standin.responder = responder(generation=EMPTY_GENERATION)
    again = run(openai_standin, log, group())
    assert again.judgements[0].rubric_version == "2" and again.new_rubrics == ()
    last_gen = [r for r in openai_standin.chat_requests if name_of(r.json) == "rubric_generation"][-1]
    assert "Pivots on evidence" in last_gen.json["messages"][1]["content"]


def test_generation_not_json_means_no_new_rubrics(openai_standin: OpenAIStandIn) -> None:
    openai_standin.responder = responder(generation="Here are some rubrics: be good.")
    result = run(openai_standin)  # in-memory buffer: only the persistent rubric exists
    a, b, _ = result.judgements
    assert result.generation_error and "JudgeOutputInvalid" in result.generation_error
    assert result.usage.calls == len(openai_standin.chat_requests)  # the failed generation's two calls count too
    assert a.scaffold["rubric_generation"].startswith("failed")
    assert a.stages["answer"].score == 1.0 and b.stages["answer"].score == 0.0
    for s in ("plan", "research"):
        assert a.stages[s].score is None and "no rubrics" in (a.stages[s].error or "")
    assert a.failed_stages == 0 and not a.fallback_answer_only
    assert a.rubric_version == "mem-1"


def test_empty_rubric_lists_leave_stages_unscored(openai_standin: OpenAIStandIn) -> None:
    openai_standin.responder = responder(generation=EMPTY_GENERATION)
    result = run(openai_standin, persistent=())
    assert not [r for r in openai_standin.chat_requests if name_of(r.json) == "stage_scoring"]
    a, b, c = result.judgements
    for j in (a, b, c):
        assert j.failed_stages == 0 and not j.fallback_answer_only
    # A present stage with no rubrics is unscored (open point 9); the third trajectory has no Review, and an absent
    # stage scores 0 whatever its rubrics (D7).
    absent = {(2, "review")}
    for i, j in enumerate((a, b, c)):
        for s in STAGES:
            res = j.stages[s]
            if (i, s) in absent:
                assert res.score == 0.0 and res.error == ABSENT_NOTE
            else:
                assert res.score is None and "no rubrics for this stage yet" in (res.error or "")


@pytest.mark.parametrize(
    "bad",
    ["not json, sorry", json.dumps({"scores": "all good"}), json.dumps({"grades": []}), json.dumps({"scores": []}),
     json.dumps({"scores": [{"index": 1, "score": 3, "justification": "x"}]}),
     json.dumps({"scores": [{"index": 99, "score": 1, "justification": "x"}]})],
    ids=["not-json", "wrong-shape", "wrong-key", "empty-list", "score-out-of-range", "index-out-of-range"],
)  # fmt: skip
def test_unusable_scoring_is_none_and_counted(openai_standin: OpenAIStandIn, bad: str) -> None:
    openai_standin.responder = responder(score=lambda req: bad)
    a, b, c = run(openai_standin).judgements
    for j, present_with_rubrics in ((a, 4), (b, 4), (c, 3)):
        assert all(j.stages[s].score is None for s in ("plan", "research", "answer"))
        assert j.fallback_answer_only and j.failed_stages == present_with_rubrics
        assert "JudgeOutputInvalid" in (j.stages["plan"].error or "")
        assert j.scaffold["scoring_error"] and j.scaffold["fallback_error"]
    assert c.stages["review"].score is None  # the answer-only fallback keeps nothing but the Answer
    # main call + repair, then the answer-only call + repair, per trajectory
    assert len([r for r in openai_standin.chat_requests if name_of(r.json) == "stage_scoring"]) == 12


def test_out_of_range_then_repaired(openai_standin: OpenAIStandIn) -> None:
    def score(req: dict) -> str:
        if "could not be used" in req["messages"][-1]["content"]:
            return scorer(req)
        return json.dumps({"scores": [{"index": 1, "score": 7, "justification": "x"}]})

    openai_standin.responder = responder(score=score)
    a, _, _ = run(openai_standin).judgements
    assert a.stage_scores() == pytest.approx({"plan": 1.0, "research": 11 / 14, "review": 1.0, "answer": 1.0})
    assert a.failed_stages == 0


def test_answer_only_fallback_scores_the_answer(openai_standin: OpenAIStandIn) -> None:
    def score(req: dict) -> str:
        if "Only the final answer is shown" in req["messages"][1]["content"]:
            return scorer(req)
        return "garbage"

    openai_standin.responder = responder(score=score)
    a, b, c = run(openai_standin).judgements
    assert a.fallback_answer_only and a.stage_scores() == {
        "plan": None,
        "research": None,
        "review": None,
        "answer": 1.0,
    }
    assert b.stage_scores()["answer"] == 0.0 and b.failed_stages == 3
    assert c.stage_scores() == {"plan": None, "research": None, "review": None, "answer": 14 / 16}
    fallback_prompt = next(
        r.json["messages"][1]["content"]
        for r in openai_standin.chat_requests
        if "Only the final answer is shown" in r.json["messages"][1]["content"]
    )
    assert "Stage 1 (Plan)" not in fallback_prompt and "### Stage 2" not in fallback_prompt


def test_partial_scores_leave_missing_rubrics_none(openai_standin: OpenAIStandIn) -> None:
    openai_standin.responder = responder(score=lambda req: scorer(req, omit={"Identifies the era", "Specific queries"}))
    a, _, _ = run(openai_standin).judgements
    assert a.stages["plan"].score is None and a.failed_stages == 1  # its only rubric was skipped
    assert a.stages["research"].score == pytest.approx((0 + 1 + 4) / 8)  # only the scored rubrics count
    assert a.scaffold["unscored_rubrics"] == 2 and not a.fallback_answer_only
    assert a.stages["plan"].rubric_scores[0].justification == "not scored by the judge"


def test_500s_then_recovery(openai_standin: OpenAIStandIn) -> None:
    openai_standin.push(status=500, times=2)
    openai_standin.push(status=503)
    openai_standin.responder = responder()
    a, b, _ = run(openai_standin, max_retries=4, concurrency=1).judgements
    assert a.stage_scores()["research"] == pytest.approx(11 / 14) and b.failed_stages == 0


def test_scoring_timeouts_with_a_live_generator_raise_nothing_judged(openai_standin: OpenAIStandIn) -> None:
    answer = threading.Event()  # scoring is answered only after the test: every scoring call times out

    def score(req: dict) -> Reply:
        return Reply(content=scorer(req), hold=answer)

    openai_standin.responder = responder(score=score)
    try:
        with pytest.raises(JudgeUnavailable):
            run(openai_standin, timeout_s=TIMEOUT_S)
    finally:
        answer.set()
    by_name = [name_of(r.json) for r in openai_standin.chat_requests]
    # one scoring call per trajectory, none retried (max_retries=0), no answer-only fallback sent to a dead endpoint
    assert by_name.count("rubric_generation") == 1 and by_name.count("stage_scoring") == 3
    # the generator answered: its rubrics were sent for scoring, so the failure is the scoring timeouts alone
    assert any("Specific queries" in r.json["messages"][1]["content"] for r in openai_standin.chat_requests
               if name_of(r.json) == "stage_scoring")  # fmt: skip


def test_some_timeouts_are_recorded_not_raised(openai_standin: OpenAIStandIn) -> None:
    answer = threading.Event()  # B's scoring is answered only after the test: its timeout is certain to fire

    def score(req: dict) -> str | Reply:
        return Reply(content=scorer(req), hold=answer) if variant_of(req) == "B" else scorer(req)

    openai_standin.responder = responder(score=score)
    try:
        a, b, c = run(openai_standin, timeout_s=TIMEOUT_S).judgements
    finally:
        answer.set()
    assert a.failed_stages == 0 and c.failed_stages == 0
    assert b.stage_scores() == {s: None for s in STAGES} and b.fallback_answer_only
    assert b.failed_stages == 4 and "JudgeUnavailable" in (b.stages["answer"].error or "")
    # the dead endpoint gets no extra answer-only call
    assert len([r for r in openai_standin.chat_requests if variant_of(r.json) == "B"
                and name_of(r.json) == "stage_scoring"]) == 1  # fmt: skip


def test_endpoint_down_raises_unavailable(openai_standin: OpenAIStandIn) -> None:
    openai_standin.responder = lambda req: Reply(status=500)
    with pytest.raises(JudgeUnavailable):
        run(openai_standin, persistent=())  # generation fails and there is nothing to score
    with pytest.raises(JudgeUnavailable):
        run(openai_standin)  # the persistent rubric's scoring calls fail too


def test_rejected_requests_raise_request_error(openai_standin: OpenAIStandIn) -> None:
    openai_standin.api_key = "right"
    openai_standin.responder = responder()
    with pytest.raises(JudgeRequestError):
        run(openai_standin, api_key="wrong")


def test_wrong_question_is_a_typed_error(openai_standin: OpenAIStandIn) -> None:
    with pytest.raises(ValueError, match="different question"):
        run(openai_standin, trajs=[trajectory(question="Something else?")])


def test_judge_group_and_low_level_api(openai_standin: OpenAIStandIn) -> None:
    openai_standin.responder = responder()
    buffer = RubricBuffer.empty(QUESTION).with_persistent([PERSISTENT])

    async def go() -> tuple:
        async with client_for(openai_standin) as client:
            judge = LLMJudge(client)
            generated = await judge.generate_rubrics(QUESTION, group(), buffer)
            scores = await judge.score_trajectory(group()[0], buffer.stage_rubrics("answer"))
            judgements = await judge.judge_group(QUESTION, group()[:1], [PERSISTENT])
            return judge, generated, scores, judgements

    judge, generated, scores, judgements = asyncio.run(go())
    assert judge.kind == "llm" and judge.model == "standin-judge"
    assert len(generated.rubrics) == 8 and generated.error is None
    assert [r.title for r in generated.by_stage("answer")] == ["Correct language", "Unsupported claims"]
    assert generated.by_stage("answer")[1].polarity == "negative"
    assert buffer.size("answer") == 0  # generate_rubrics does not touch the buffer
    assert scores.score_of("gt-1") == 2 and scores.called
    assert len(judgements) == 1 and judgements[0].session_id == "sa"


def test_render_trajectory_fits_and_keeps_every_stage() -> None:
    long = trajectory(answer="The answer. " * 500, tool_output_text="evidence " * 2000, queries=("q1", "q2", "q3"))
    text = render_trajectory(long, 3000)
    assert len(text) <= 3000
    for n in range(1, 5):
        assert f"### Stage {n}:" in text
    assert "characters cut" in text
    short = render_trajectory(trajectory(), 12000)
    assert "characters cut" not in short and "<deep_analysis>" in short


def test_citation_support_check_in_a_round(openai_standin: OpenAIStandIn) -> None:
    def score(req: dict) -> str:
        if name_of(req) == "citation_support":
            return json.dumps({"supported": "Latin" in req["messages"][1]["content"], "reason": "r"})
        return scorer(req)

    openai_standin.responder = responder(score=score)

    async def go() -> list:
        async with client_for(openai_standin) as client:
            return await LLMJudge(client, citation_support_check=True).judge_group(QUESTION, group(), [PERSISTENT])

    a, b, c = asyncio.run(go())
    assert (a.citations.support_checked, a.citations.supported) == (1, 1)
    assert b.citations.support_checked == 0  # its only cite names no retrieved snippet: nothing to check
    assert a.scaffold["citation_support_failures"] == 0
    assert a.usage.calls == 3 and c.usage.calls == 2  # generation + scoring + support; scoring + support
