"""An edited plan's rubric items reach the judge for that session as user rubrics (issue 21): real SQLite log, the
real offline judge on the bundled MiniLM, scripted answers."""

from __future__ import annotations

import asyncio
from pathlib import Path

from learning.judge.offline import OfflineJudge
from learning.judge.pipeline import judge_pending
from learning.judge.user_rubrics import USER_RUBRIC_WEIGHT, user_rubrics
from store.session_log import SessionLog
from store.session_log.checkpoints import PlanApproval, SessionRuns
from tests.judge.builders import PLAN, store_session, trajectory

LATIN = 'Books were translated into <cite id="abcd0001-0">Latin</cite>.'
ITEM = "States the year Haymo of Faversham died (1244)"


def judged(tmp: Path, answer: str, approval: str | None) -> tuple[float, dict[str, int | None]]:
    """Judge one stored session (with an edited plan when `approval` is an action) and return its Answer score and
    rubric scores."""
    log = SessionLog(tmp / "rubricem.sqlite3")
    sid = store_session(log, trajectory("s1", answer=answer), report="# report")
    if approval is not None:
        SessionRuns(log).record_approval(PlanApproval(
            sid, approval, "alice", PLAN, {"rubric": [ITEM], "note": "check his death"} if approval == "edit" else {}))
    summary = asyncio.run(judge_pending(log, OfflineJudge(log)))
    assert summary.judged == 1
    (j,) = log.judgements(sid)
    answer_stage = j.payload["stages"]["answer"]
    log.close()
    return answer_stage["score"], {s["rubric_id"]: s["score"] for s in answer_stage["rubric_scores"]}


def test_the_user_rubric_reaches_the_judge_and_moves_the_answer_score(tmp_path: Path) -> None:
    (rubric,) = user_rubrics([ITEM])
    assert (rubric.stage, rubric.weight, rubric.polarity, rubric.persistent) == ("answer", USER_RUBRIC_WEIGHT, "positive", True)
    assert USER_RUBRIC_WEIGHT == 2 and ITEM in rubric.title and ITEM in rubric.description

    paths = {k: tmp_path / k for k in ("plain", "accepted", "missed", "covered")}
    for p in paths.values():
        p.mkdir()
    plain_score, plain_rubrics = judged(paths["plain"], LATIN, None)
    accepted_score, accepted_rubrics = judged(paths["accepted"], LATIN, "accept")
    missed_score, missed_rubrics = judged(paths["missed"], LATIN, "edit")
    covered_score, covered_rubrics = judged(paths["covered"], LATIN + " Haymo of Faversham died in 1244.", "edit")

    # Accepting the policy's plan adds no user rubric: judged exactly as without approval.
    assert rubric.id not in plain_rubrics and accepted_rubrics == plain_rubrics and accepted_score == plain_score
    # The edited plan's item is scored for the session: an answer that misses it scores lower than without the
    # user's rubric, one that covers it gets the item in full.
    assert missed_rubrics == {rubric.id: 0}
    assert missed_score < plain_score
    assert covered_rubrics == {rubric.id: 2}
    assert covered_score > missed_score


def test_a_users_plan_rubric_never_reaches_another_session_of_the_same_question(tmp_path: Path) -> None:
    """Scoped to its session: the edited plan's item is scored for Alice's session, and Bob's later session of the
    same question (judged in another run, against the same store) is not judged against it; the question's shared
    rubric buffer never holds it."""
    from learning.judge.buffer import load_buffer

    (rubric,) = user_rubrics([ITEM])
    log = SessionLog(tmp_path / "rubricem.sqlite3")
    alice = store_session(log, trajectory("alice", answer=LATIN), report="# report")
    SessionRuns(log).record_approval(PlanApproval(alice, "edit", "alice", PLAN, {"rubric": [ITEM], "note": ""}))
    judge = OfflineJudge(log)
    assert asyncio.run(judge_pending(log, judge)).judged == 1
    bob = store_session(log, trajectory("bob", answer=LATIN), report="# report")
    assert asyncio.run(judge_pending(log, judge)).judged == 1

    def answer_rubrics(sid: str) -> set[str]:
        (j,) = log.judgements(sid)
        return {s["rubric_id"] for s in j.payload["stages"]["answer"]["rubric_scores"]}

    assert rubric.id in answer_rubrics(alice)
    assert rubric.id not in answer_rubrics(bob)
    buffer = load_buffer(log, trajectory("x").question)
    assert all(ITEM not in r.title for r in buffer.all_rubrics())
    log.close()
