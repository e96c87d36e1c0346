"""Feedback notes become persistent Answer-stage rubrics, and `judge_pending` scores sessions against them (real
SQLite log, the real offline judge on the bundled MiniLM)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from learning.judge.buffer import RubricBuffer, rubric_id
from learning.judge.feedback import (
    FEEDBACK_TITLE_PREFIX,
    MAX_FEEDBACK_RUBRICS,
    TITLE_CHARS,
    feedback_rubrics,
)
from learning.judge.offline import OfflineJudge
from learning.judge.pipeline import judge_pending
from store.deletion import FEEDBACK_RUBRIC_TITLE
from store.owner import acting_as
from store.people import ScopedStore, Viewer
from store.records import Trajectory, question_sha
from store.session_log import FeedbackRecord, SessionLog
from tests.judge.builders import QUESTION, store_session, trajectory


def fb(note: str, rating: str | None = "down", n: int = 1) -> FeedbackRecord:
    return FeedbackRecord(feedback_id=n, session_id=f"s{n}", question=QUESTION, rating=rating,  # type: ignore[arg-type]
                          note=note, created_at=f"2025-01-01T00:00:0{n % 10}+00:00")


def test_each_distinct_note_becomes_one_persistent_answer_rubric() -> None:
    rubrics = feedback_rubrics([
        fb("It never says when Haymo died.", n=1),
        fb("", rating="up", n=2),  # a thumb without a note says what, not why: nothing to check
        fb("  it never   says when HAYMO died ", n=3),  # the same note again
        fb("Cite the chronicle, not a blog.", rating=None, n=4),
    ])
    assert [r.title for r in rubrics] == [
        FEEDBACK_TITLE_PREFIX + "it never says when HAYMO died",  # the newest wording of a repeated note
        FEEDBACK_TITLE_PREFIX + "Cite the chronicle, not a blog.",
    ]
    for r in rubrics:
        assert (r.stage, r.weight, r.polarity, r.persistent) == ("answer", 2, "positive", True)
        assert r.id.startswith("p4-")
    assert '"it never says when HAYMO died"' in rubrics[0].description
    assert "rated the answer down" in rubrics[0].description
    assert '"Cite the chronicle, not a blog."' in rubrics[1].description
    # Stable ids: the same note gives the same rubric on every run, whatever its spacing or case.
    assert feedback_rubrics([fb("It never says when Haymo died.")])[0].id == rubrics[0].id
    assert rubrics[0].id == rubric_id("answer", "user feedback it never says when haymo died", persistent=True)
    assert feedback_rubrics([fb("", rating="up"), fb("   ", rating="down")]) == ()
    assert feedback_rubrics([]) == ()


def test_long_notes_get_a_short_title_and_the_whole_note_in_the_description() -> None:
    note = "The answer should explain " + "why Latin was the scholarly language of the time " * 5
    (r,) = feedback_rubrics([fb(note)])
    assert r.title.startswith(FEEDBACK_TITLE_PREFIX + "The answer should explain why") and r.title.endswith("…")
    assert len(r.title) <= len(FEEDBACK_TITLE_PREFIX) + TITLE_CHARS + 1
    assert " ".join(note.split()) in r.description
    # Two notes that start alike still become two rubrics the buffer keeps (it de-duplicates by title).
    twins = feedback_rubrics([fb(note + " First."), fb(note + " Second.", n=2)])
    assert len({t.title for t in twins}) == 2 and len({t.id for t in twins}) == 2
    kept = RubricBuffer.empty(QUESTION).with_persistent(twins)
    assert [p.id for p in kept.persistent] == [t.id for t in twins]


def test_many_notes_keep_the_newest() -> None:
    notes = [fb(f"Point number {i} is missing", n=i) for i in range(MAX_FEEDBACK_RUBRICS + 3)]
    rubrics = feedback_rubrics(notes)
    assert len(rubrics) == MAX_FEEDBACK_RUBRICS
    assert rubrics[0].title.endswith("Point number 3 is missing")
    assert rubrics[-1].title.endswith(f"Point number {MAX_FEEDBACK_RUBRICS + 2} is missing")


# --- judging stored sessions ----------------------------------------------------------------------------------


def store(log: SessionLog, t: Trajectory) -> str:
    """Write a built trajectory into the log as a completed session."""
    return store_session(log, t, report="# report", policy_version="policy@1")


LATIN = 'Books were translated into <cite id="abcd0001-0">Latin</cite>.'
NOTE = "It never said when Haymo of Faversham died (1244)."
OTHER_QUESTION = "Who founded the Franciscan order?"


def test_judge_pending_scores_every_session_of_the_question_against_its_feedback(tmp_path: Path) -> None:
    log = SessionLog(tmp_path / "rubricem.sqlite3")
    earlier = store(log, trajectory("earlier", answer=LATIN))
    log.add_feedback(earlier, "down", NOTE)
    log.add_feedback(earlier, "up", "")  # a bare thumb adds no rubric
    addressed = store(log, trajectory("addressed", question="  in which LANGUAGE were books translated in Haymo "
                                      "of Faversham's era?", answer=LATIN + " Haymo of Faversham died in 1244."))
    ignored = store(log, trajectory("ignored", answer=LATIN))
    elsewhere = store(log, trajectory("elsewhere", question=OTHER_QUESTION, answer="Francis of Assisi founded it."))
    (feedback_rubric,) = feedback_rubrics(log.feedback(earlier))

    summary = asyncio.run(judge_pending(log, OfflineJudge(log)))
    assert (summary.judged, summary.failed, summary.groups) == (4, 0, 2)

    def answer_scores(sid: str) -> dict[str, int | None]:
        (j,) = log.judgements(sid)
        assert j.status == "ok"
        return {s["rubric_id"]: s["score"] for s in j.payload["stages"]["answer"]["rubric_scores"]}

    # The note is the Answer stage's rubric for the whole question group (the offline judge scores Answer on the
    # persistent rubrics when a question has any), and it separates the answer that took it up from the others.
    assert answer_scores(addressed) == {feedback_rubric.id: 2}
    assert answer_scores(ignored) == {feedback_rubric.id: 0}
    assert answer_scores(earlier) == {feedback_rubric.id: 0}
    better, worse = (summary.judgements[sid].stages["answer"].score for sid in (addressed, ignored))
    assert better is not None and worse is not None and better > worse
    assert summary.judgements[addressed].scaffold["offline"]["answer"]["rubric_source"] == "persistent"

    # The rubric judges that group only: it is never saved in the question's shared buffer (issue 34), and the other
    # question never sees it.
    assert log.load_rubric_buffer(question_sha(QUESTION)) is None
    assert feedback_rubric.id not in answer_scores(elsewhere)
    assert summary.judgements[elsewhere].scaffold["offline"]["answer"]["rubric_source"] != "persistent"
    assert log.load_rubric_buffer(question_sha(OTHER_QUESTION)) is None
    log.close()


def test_one_persons_note_judges_only_their_own_sessions_of_the_question(tmp_path: Path) -> None:
    """Issue 34: alice's note on her answer becomes a rubric for her later sessions of the question, never for bob's
    (before, it scored everyone's sessions of the question and was saved in its shared buffer)."""
    log = SessionLog(tmp_path / "rubricem.sqlite3")
    with acting_as("alice"):
        earlier = store(log, trajectory("a-earlier", answer=LATIN))
        ScopedStore(log, Viewer("alice")).add_feedback(earlier, "down", NOTE)
        hers = store(log, trajectory("a-later", answer=LATIN + " Haymo of Faversham died in 1244."))
    with acting_as("bob"):
        bobs = store(log, trajectory("b-1", answer=LATIN + " Haymo of Faversham died in 1244."))
        bobs_too = store(log, trajectory("b-2", answer=LATIN))
    (note_rubric,) = feedback_rubrics(log.feedback(earlier))

    summary = asyncio.run(judge_pending(log, OfflineJudge(log)))
    assert (summary.judged, summary.failed) == (4, 0)

    def answer_rubrics(sid: str) -> set[str]:
        (j,) = log.judgements(sid)
        return {s["rubric_id"] for s in j.payload["stages"]["answer"]["rubric_scores"]}

    assert note_rubric.id in answer_rubrics(hers) and note_rubric.id in answer_rubrics(earlier)
    assert note_rubric.id not in answer_rubrics(bobs) and note_rubric.id not in answer_rubrics(bobs_too)
    assert all(NOTE not in json.dumps(j.payload) for sid in (bobs, bobs_too) for j in log.judgements(sid))
    assert log.load_rubric_buffer(question_sha(QUESTION)) is None  # nothing of hers was saved for the question
    log.close()


def test_the_store_and_the_judge_agree_on_the_feedback_rubric_title() -> None:
    """A deletion strips rubrics made from notes out of buffers saved before issue 34 by this title."""
    assert FEEDBACK_TITLE_PREFIX == FEEDBACK_RUBRIC_TITLE
    assert feedback_rubrics([fb("It never says when Haymo died.")])[0].title.startswith(FEEDBACK_RUBRIC_TITLE)
