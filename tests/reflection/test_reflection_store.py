"""The session log's reflection tables: exact round trip, one-transaction batches, and who may be reflected on."""

from __future__ import annotations

import math
import sqlite3
from dataclasses import replace

import pytest

from store.errors import InvalidInput, SessionNotCompleted, SessionNotFound, SessionStateError
from store.records import PromptRecord
from store.session_log import ReflectionCandidate, ReflectionCandidateRecord, SessionLog
from tests.reflection.helpers import add_session

PROMPT = PromptRecord(text="<|im_start|>system\nreflect<|im_end|>\n", token_ids=(1, 2, 3, 2**31 - 1), prompt_sha="abc")
VALID = "<reflection_rubrics>Pitfalls: x y z</reflection_rubrics>\n<reflection_takeaways>1. a b c"


def candidate(index: int, **kw: object) -> ReflectionCandidate:
    base: dict[str, object] = {
        "index": index, "text": VALID, "token_ids": (5, 6, 7), "logprobs": (-0.5, -math.inf, -1e-300),
        "policy_version": "policy@1", "forced_suffix": "</reflection_takeaways>", "seed": 40 + index, "valid": True,
        "diagnostic_accuracy": 0.8, "specificity": 0.5, "scope_balance": 0.6, "u_within": 0.671, "u_cross": 0.6,
        "u": 0.636, "justification": "fine",
    }  # fmt: skip
    base.update(kw)
    return ReflectionCandidate(**base)  # type: ignore[arg-type]


INVALID = candidate(1, text="just advice", forced_suffix="", valid=False, validity_error="needs blocks",
                    diagnostic_accuracy=None, specificity=None, scope_balance=None, u_within=None, u_cross=None,
                    u=None, justification="", finish_reason="length")  # fmt: skip


def record(log: SessionLog, sid: str, cands: list[ReflectionCandidate], **kw: object) -> str:
    args: dict[str, object] = {"prompt": PROMPT, "judge_model": "offline", "temperature": 0.7, "max_tokens": 64}
    args.update(kw)
    return log.record_reflection_batch(sid, cands, **args)  # type: ignore[arg-type]


def count_rows(log: SessionLog) -> int:
    with sqlite3.connect(log.path) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM reflection_candidates").fetchone()[0])


def test_batch_round_trips_exactly(log: SessionLog) -> None:
    sid = add_session(log, "s1")
    batch = record(log, sid, [candidate(0, logprobs=(math.nan, -0.0, -2.5)), INVALID], batch_id="b1")
    assert batch == "b1"
    rows = log.reflection_candidates(session_id=sid)
    assert [r.candidate.index for r in rows] == [0, 1]
    first, second = rows
    assert first.batch_id == "b1" and first.session_id == sid and first.prompt == PROMPT
    assert first.temperature == 0.7 and first.max_tokens == 64 and first.judge_model == "offline"
    assert first.candidate.token_ids == (5, 6, 7) and first.candidate.seed == 40
    assert math.isnan(first.candidate.logprobs[0]) and math.copysign(1, first.candidate.logprobs[1]) == -1
    assert first.candidate.text == VALID and first.candidate.full_text == VALID + "</reflection_takeaways>"
    assert first.candidate.u == 0.636 and first.candidate.u_cross == 0.6
    assert first.candidate.policy_version == "policy@1"
    assert not first.accepted and first.bank_item_id is None
    assert second.candidate == INVALID
    def keys(records: list[ReflectionCandidateRecord]) -> list[tuple[str, int]]:
        return [(r.batch_id, r.candidate.index) for r in records]  # (NaN logprobs make == useless on records)

    assert keys(log.reflection_candidates(batch_id="b1")) == keys(log.reflection_candidates()) == keys(rows)
    assert log.reflection_candidates(batch_id="nope") == []


def test_a_bad_candidate_fails_the_whole_batch(log: SessionLog) -> None:
    sid = add_session(log, "s1")
    # Found while encoding: a score outside [0, 1], a scored invalid candidate, misaligned logprobs.
    for bad in (candidate(2, u=1.5), replace(INVALID, index=2, u=0.5), candidate(2, logprobs=(-1.0,))):
        with pytest.raises(InvalidInput):
            record(log, sid, [candidate(0), INVALID, bad])
        assert count_rows(log) == 0
    # Rejected by the database part-way through the insert (the first two rows were already in): rolled back.
    with pytest.raises(InvalidInput, match="rejected"):
        record(log, sid, [candidate(0), INVALID, candidate(1)])
    assert count_rows(log) == 0
    assert log.sessions_without_reflection() == [sid]
    record(log, sid, [candidate(0), INVALID], batch_id="b1")
    with pytest.raises(InvalidInput, match="already exists"):
        record(log, sid, [candidate(0)], batch_id="b1")
    assert count_rows(log) == 2


def test_only_judged_completed_sessions_take_reflections(log: SessionLog) -> None:
    running = add_session(log, "running", status="running")
    failed = add_session(log, "failed", status="failed", judged=None)
    unjudged = add_session(log, "unjudged", judged=None)
    judge_failed = add_session(log, "judge-failed", judged="failed")
    ok = add_session(log, "ok")
    for sid in (running, failed):
        with pytest.raises(SessionNotCompleted):
            record(log, sid, [candidate(0)])
    for sid in (unjudged, judge_failed):
        with pytest.raises(SessionStateError, match="not judged"):
            record(log, sid, [candidate(0)])
    with pytest.raises(SessionNotFound):
        record(log, "ghost", [candidate(0)])
    assert count_rows(log) == 0
    assert log.sessions_without_reflection() == [ok]
    record(log, ok, [INVALID])  # a batch counts whatever its outcome
    assert log.sessions_without_reflection() == []


def test_pending_order_and_limit(log: SessionLog) -> None:
    ids = [add_session(log, f"s{i}") for i in range(3)]
    assert log.sessions_without_reflection() == ids
    assert log.sessions_without_reflection(limit=2) == ids[:2]
    with pytest.raises(InvalidInput):
        log.sessions_without_reflection(limit=0)


def test_mark_accepted_rules(log: SessionLog) -> None:
    sid = add_session(log, "s1")
    batch = record(log, sid, [candidate(0), INVALID, candidate(2, u=None, u_within=None, u_cross=None,
                                                                    diagnostic_accuracy=None, specificity=None,
                                                                    scope_balance=None, judge_error="judge down")])
    with pytest.raises(InvalidInput, match="invalid or unscored"):
        log.mark_reflection_accepted(batch, 1, "bank-1")  # invalid
    with pytest.raises(InvalidInput, match="invalid or unscored"):
        log.mark_reflection_accepted(batch, 2, "bank-1")  # unscored (the judge failed)
    with pytest.raises(InvalidInput, match="no reflection candidate"):
        log.mark_reflection_accepted(batch, 7, "bank-1")
    log.mark_reflection_accepted(batch, 0, "bank-1")
    log.mark_reflection_accepted(batch, 0, "bank-1")  # idempotent
    with pytest.raises(InvalidInput, match="already accepted"):
        log.mark_reflection_accepted(batch, 0, "bank-2")
    rows = log.reflection_candidates(batch_id=batch)
    assert [(r.accepted, r.bank_item_id) for r in rows] == [(True, "bank-1"), (False, None), (False, None)]


def test_bad_arguments_are_typed_errors(log: SessionLog) -> None:
    sid = add_session(log, "s1")
    for kw in ({"temperature": -1.0}, {"max_tokens": 0}, {"judge_model": ""}, {"prompt": "text"}):
        with pytest.raises(InvalidInput):
            record(log, sid, [candidate(0)], **kw)
    with pytest.raises(InvalidInput):
        record(log, sid, [])
    with pytest.raises(InvalidInput):
        record(log, sid, [candidate(-1)])
    with pytest.raises(InvalidInput):
        record(log, sid, [candidate(0, seed=2**70)])
    with pytest.raises(SessionNotFound):
        log.reflection_candidates(session_id="ghost")
    assert count_rows(log) == 0
