"""The reflection writer end to end: real session log, real embedded bank, real judges; the policy is scripted.

The policy is the LLM boundary, so `tests/fakes.ScriptedPolicy` (the agent tests' policy-server double, exact byte
tokens and real stop semantics) says what the "model" writes; everything after it is the real code.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Sequence
from typing import Any

import pytest

from agent.errors import PolicyUnavailable
from learning.judge.client import JudgeClient
from learning.judge.offline_reflection import OFFLINE_REFLECTION_MODEL, OfflineReflectionJudge
from learning.judge.reflection import ReflectionJudge, validity_error
from learning.reflection import (
    InvalidReflectionArgs,
    NotReflectable,
    ReflectionOutcome,
    reflect_pending,
    write_reflection,
)
from learning.reflection.writer import CLOSE_TAG, reflection_prompt_sha
from store.errors import SessionNotFound
from store.rubric_bank import RubricBank
from store.session_log import ReflectionCandidateRecord, SessionLog
from tests.fakes import ScriptedPolicy, byte_ids
from tests.judge.builders import QUESTION
from tests.judge.openai_standin import OpenAIStandIn, Reply
from tests.reflection.helpers import GENERIC, GOOD, add_session

TWO_TAKEAWAYS = GOOD.split("<reflection_takeaways>")[1].split("</reflection_takeaways>")[0].strip()
# Great content, but the rubrics block twice: invalid, so it must never reach the bank. (A second takeaways block
# cannot occur: sampling stops at the first closing tag.)
INVALID_GREAT = GOOD.replace(
    "<reflection_takeaways>", "<reflection_rubrics>Pitfalls: the era again</reflection_rubrics>\n<reflection_takeaways>"
)
NO_BLOCKS = "The attempt was fine; be more careful next time."
OTHER_QUESTION = "Which order did Haymo of Faversham belong to?"


def policy_saying(*outputs: str, keep_stop: bool = True, fail_on: str | None = None) -> ScriptedPolicy:
    """Candidate i says outputs[i % len(outputs)]; a context containing `fail_on` makes the server fail."""
    calls = [0]

    def script(context: str, stop: Sequence[str]) -> str:
        if fail_on is not None and fail_on in context:
            raise PolicyUnavailable("the policy server is down")
        out = outputs[calls[0] % len(outputs)]
        calls[0] += 1
        return out

    return ScriptedPolicy(script, keep_stop=keep_stop, version="policy@3")


def reflect(sid: str, log: SessionLog, policy: ScriptedPolicy, bank: RubricBank, judge: Any = None,
            **kw: Any) -> ReflectionOutcome:  # fmt: skip
    judge = judge if judge is not None else OfflineReflectionJudge()
    return asyncio.run(write_reflection(sid, log=log, policy=policy, judge=judge, bank=bank, **kw))


def rows_of(log: SessionLog, sid: str) -> list[ReflectionCandidateRecord]:
    return log.reflection_candidates(session_id=sid)


def test_best_valid_candidate_is_banked_and_every_candidate_stored(log: SessionLog, bank: RubricBank) -> None:
    sid = add_session(log, "s1")
    policy = policy_saying(GENERIC, INVALID_GREAT, GOOD, NO_BLOCKS)
    out = reflect(sid, log, policy, bank, candidates=4, seed=7, max_tokens=4000)
    assert out.reason == "accepted" and out.best == 2 and out.candidates == 4 and out.valid == 2 and out.scored == 2
    item = bank.get(out.accepted or "")
    assert bank.count() == 1 and item.takeaways == TWO_TAKEAWAYS and item.session_id == sid
    assert item.score == out.best_score and item.judge_model == OFFLINE_REFLECTION_MODEL
    assert item.policy_version == "policy@3" and item.question == QUESTION

    rows = rows_of(log, sid)
    assert [r.candidate.valid for r in rows] == [True, False, True, False]
    assert [(r.accepted, r.bank_item_id) for r in rows] == [(False, None), (False, None), (True, item.id),
                                                            (False, None)]  # fmt: skip
    assert rows[2].candidate.u == out.best_score and rows[0].candidate.u < rows[2].candidate.u  # type: ignore[operator]
    assert rows[1].candidate.u is None and "reflection_rubrics" in (rows[1].candidate.validity_error or "")
    for i, r in enumerate(rows):  # exactly what was sampled: the trainer's input
        assert r.candidate.token_ids == byte_ids(r.candidate.text) and r.candidate.forced_suffix == ""
        assert r.candidate.logprobs == tuple(-math.log(2.0) for _ in r.candidate.token_ids)
        assert r.candidate.seed == 7 + i and r.temperature == 0.7 and r.max_tokens == 4000
        assert r.prompt.token_ids == byte_ids(r.prompt.text) and r.prompt.prompt_sha == reflection_prompt_sha()
    assert rows[2].candidate.text.endswith(CLOSE_TAG)  # the sampled closing tag is kept (and trained)
    assert all(c["stop"] == [CLOSE_TAG] and c["max_tokens"] == 4000 for c in policy.calls)

    prompt = rows[0].prompt.text
    assert "post-mortem" in prompt and "<reflection_rubrics>" in prompt and QUESTION in prompt
    assert "### Stage 4: Answer" in prompt and "Books were translated into Latin" in prompt  # tool output shown
    assert "never dated" not in prompt and "R =" not in prompt  # no judge scores or justifications


def test_only_judged_completed_sessions_are_reflected(log: SessionLog, bank: RubricBank) -> None:
    policy = policy_saying(GOOD)
    for sid, kw in (("running", {"status": "running"}), ("failed", {"status": "failed", "judged": None}),
                    ("unjudged", {"judged": None}), ("judge-failed", {"judged": "failed"})):  # fmt: skip
        add_session(log, sid, **kw)
        with pytest.raises(NotReflectable):
            reflect(sid, log, policy, bank)
    with pytest.raises(SessionNotFound):
        reflect("ghost", log, policy, bank)
    assert policy.calls == [] and log.reflection_candidates() == [] and bank.count() == 0


def test_invalid_candidates_are_never_banked(log: SessionLog, bank: RubricBank) -> None:
    sid = add_session(log, "s1")
    out = reflect(sid, log, policy_saying(INVALID_GREAT, NO_BLOCKS, GOOD.replace(CLOSE_TAG, "")), bank,
                  candidates=3, max_tokens=4000)  # fmt: skip
    assert out.reason == "no_valid_candidate" and out.valid == 0 and out.best is None and out.accepted is None
    assert bank.count() == 0
    rows = rows_of(log, sid)
    assert len(rows) == 3 and not any(r.candidate.valid or r.accepted for r in rows)
    assert rows[2].candidate.finish_reason == "stop" and rows[2].candidate.forced_suffix == ""  # ended without the tag


def test_below_threshold_is_stored_but_not_banked(log: SessionLog, bank: RubricBank) -> None:
    sid = add_session(log, "s1")
    out = reflect(sid, log, policy_saying(GOOD, GENERIC), bank, candidates=2, threshold=0.99, max_tokens=4000)
    assert out.reason == "below_threshold" and out.best == 0 and out.accepted is None
    assert bank.count() == 0
    rows = rows_of(log, sid)
    assert all(r.candidate.u is not None for r in rows) and not any(r.accepted for r in rows)


def test_a_dropped_stop_string_is_a_forced_suffix(log: SessionLog, bank: RubricBank) -> None:
    sid = add_session(log, "s1")
    out = reflect(sid, log, policy_saying(GOOD, keep_stop=False), bank, candidates=2, max_tokens=4000)
    assert out.reason == "accepted"
    for r in rows_of(log, sid):
        c = r.candidate
        assert not c.text.endswith(CLOSE_TAG) and c.forced_suffix == CLOSE_TAG  # appended, never sampled
        assert c.token_ids == byte_ids(c.text) and c.valid and validity_error(c.full_text) is None
    assert bank.get(out.accepted or "").takeaways == TWO_TAKEAWAYS


def test_judge_failure_stores_candidates_with_the_error(
    log: SessionLog, bank: RubricBank, openai_standin: OpenAIStandIn
) -> None:
    sid = add_session(log, "s1")
    openai_standin.responder = lambda req: Reply(status=503)

    async def go() -> ReflectionOutcome:
        async with JudgeClient(openai_standin.root, "judge-x", max_retries=0, backoff_s=0.01) as client:
            return await write_reflection(sid, log=log, policy=policy_saying(GOOD, NO_BLOCKS), bank=bank,
                                          judge=ReflectionJudge(client), candidates=2, max_tokens=4000)  # fmt: skip

    out = asyncio.run(go())
    assert out.reason == "judge_failed" and "JudgeUnavailable" in out.detail and out.accepted is None
    assert bank.count() == 0
    good, bad = rows_of(log, sid)
    assert good.judge_model == "judge-x" and good.candidate.valid and good.candidate.u is None
    assert "JudgeUnavailable" in (good.candidate.judge_error or "")
    assert not bad.candidate.valid and bad.candidate.validity_error and bad.candidate.u is None
    assert log.sessions_without_reflection() == []


def test_llm_judge_grades_decide_acceptance(log: SessionLog, bank: RubricBank, openai_standin: OpenAIStandIn) -> None:
    sid = add_session(log, "s1")

    def grade(c: int, v: float) -> dict[str, Any]:
        return {"candidate": c, "diagnostic_accuracy": v, "specificity": v, "scope_balance": v, "justification": "j"}

    openai_standin.push(content=json.dumps({"grades": [grade(0, 0.4), grade(2, 0.9)]}))

    async def go() -> ReflectionOutcome:
        async with JudgeClient(openai_standin.root, "judge-x", max_retries=0) as client:
            return await write_reflection(sid, log=log, policy=policy_saying(GENERIC, NO_BLOCKS, GOOD), bank=bank,
                                          judge=ReflectionJudge(client), candidates=3, max_tokens=4000)  # fmt: skip

    out = asyncio.run(go())
    assert out.reason == "accepted" and out.best == 2 and out.best_score == pytest.approx(0.9)
    assert bank.get(out.accepted or "").judge_model == "judge-x"
    (request,) = openai_standin.chat_requests
    shown = request.json["messages"][1]["content"]
    assert "### Candidate 0" in shown and "### Candidate 2" in shown and "### Candidate 1" not in shown
    assert [r.candidate.justification for r in rows_of(log, sid)] == ["j", "", "j"]


def test_newer_accepted_reflection_replaces_the_older(log: SessionLog, bank: RubricBank) -> None:
    first = add_session(log, "s1")
    second = add_session(log, "s2")
    a = reflect(first, log, policy_saying(GOOD), bank, candidates=1, max_tokens=4000)
    b = reflect(second, log, policy_saying(GOOD.replace("d. 1244", "died 1244")), bank, candidates=1,
                max_tokens=4000)  # fmt: skip
    assert a.reason == b.reason == "accepted" and a.accepted != b.accepted
    assert bank.count() == 1
    current = bank.by_question(QUESTION)
    assert current is not None and current.id == b.accepted and current.session_id == second
    assert "replaced " + (a.accepted or "") in b.detail
    # The older batch keeps its history: it was accepted then.
    assert rows_of(log, first)[0].accepted and rows_of(log, first)[0].bank_item_id == a.accepted


def test_bank_write_failure_leaves_the_batch_recorded(log: SessionLog, bank: RubricBank) -> None:
    sid = add_session(log, "s1")
    huge = GOOD.replace("</reflection_takeaways>", "3. Latin " + "latin " * 4000 + "\n</reflection_takeaways>")
    out = reflect(sid, log, policy_saying(huge), bank, candidates=1, max_tokens=40_000)
    assert out.reason == "bank_write_failed" and "InvalidInput" in out.detail
    assert out.accepted is None and out.best == 0 and bank.count() == 0
    (row,) = rows_of(log, sid)
    assert row.candidate.valid and row.candidate.u is not None and not row.accepted


def test_policy_failure_writes_nothing(log: SessionLog, bank: RubricBank) -> None:
    sid = add_session(log, "s1")
    with pytest.raises(PolicyUnavailable):
        reflect(sid, log, policy_saying(GOOD, fail_on=QUESTION), bank, candidates=2)
    assert log.reflection_candidates() == [] and bank.count() == 0
    assert log.sessions_without_reflection() == [sid]


def test_reflect_pending_goes_on_after_a_failure(log: SessionLog, bank: RubricBank) -> None:
    ok = add_session(log, "ok")
    broken = add_session(log, "broken", question=OTHER_QUESTION)
    add_session(log, "unjudged", judged=None)
    add_session(log, "running", status="running")
    lines: list[str] = []
    policy = policy_saying(GOOD, fail_on=OTHER_QUESTION)
    summary = asyncio.run(reflect_pending(log, policy, OfflineReflectionJudge(), bank, progress=lines.append,
                                          candidates=2, max_tokens=4000))  # fmt: skip
    assert summary.sessions == 2 and summary.stored == 1 and summary.accepted == 1 and summary.failed == 1
    assert summary.reasons == {"accepted": 1} and set(summary.outcomes) == {ok}
    assert "PolicyUnavailable" in summary.errors[0] and len(lines) == 2
    assert bank.count() == 1 and log.sessions_without_reflection() == [broken]
    again = asyncio.run(reflect_pending(log, policy_saying(GOOD), OfflineReflectionJudge(), bank, candidates=1,
                                        max_tokens=4000))  # fmt: skip
    assert again.sessions == 1 and again.accepted == 1 and bank.count() == 2
    assert log.sessions_without_reflection() == []


def test_bad_arguments_touch_nothing(log: SessionLog, bank: RubricBank) -> None:
    sid = add_session(log, "s1")
    policy = policy_saying(GOOD)
    bad: list[dict[str, Any]] = [{"candidates": 0}, {"temperature": -0.1}, {"threshold": 1.5}, {"max_tokens": 0},
                                 {"trajectory_chars": 10}, {"seed": "7"}, {"candidates": True}]  # fmt: skip
    for kw in bad:
        with pytest.raises(InvalidReflectionArgs):
            reflect(sid, log, policy, bank, **kw)
        with pytest.raises(InvalidReflectionArgs):
            asyncio.run(reflect_pending(log, policy, OfflineReflectionJudge(), bank, **kw))
    with pytest.raises(InvalidReflectionArgs, match="unknown"):
        asyncio.run(reflect_pending(log, policy, OfflineReflectionJudge(), bank, candidate=2))
    assert policy.calls == [] and log.reflection_candidates() == []

