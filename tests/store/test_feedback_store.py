"""User feedback in the session log (migration 0005), on both backends: stored, read back per session and per
question, bad input refused with nothing written."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from store.errors import InvalidInput, SessionNotFound
from store.records import PromptRecord, Turn
from store.session_log import MAX_FEEDBACK_NOTE, FeedbackRecord, SessionLog
from tests.store.conftest import StoreTarget, count_rows


def session(log: SessionLog, question: str, *, status: str = "completed") -> str:
    sid = log.create_session(question, PromptRecord("User: q", (1, 2), "p"), {}, "policy@1")
    log.append_turn(sid, Turn(stage="answer", kind="sampled", text="<answer>Latin.</answer>", token_ids=(5, 6)))
    if status != "running":
        log.finish(sid, status, report="# q\n\nLatin.\n" if status == "completed" else None)  # type: ignore[arg-type]
    return sid


def rows(log: SessionLog) -> int:
    return count_rows(log, "feedback")


@pytest.fixture
def log(store_target: StoreTarget) -> Iterator[SessionLog]:
    with store_target.open() as opened:
        yield opened


def test_feedback_is_stored_and_read_back_oldest_first(store_target: StoreTarget) -> None:
    with store_target.open() as log:
        sid = session(log, "What language did Haymo's era translate into?")
        first = log.add_feedback(sid, "up", "")
        second = log.add_feedback(sid, "down", "  It never says when Haymo died.\n ")
        third = log.add_feedback(sid, None, "Zürich — 東京: cite the source")
        assert first < second < third
    with store_target.open() as reopened:  # committed: survives closing the log
        got = reopened.feedback(sid)
    assert [(f.feedback_id, f.rating, f.note) for f in got] == [
        (first, "up", ""), (second, "down", "It never says when Haymo died."), (third, None, "Zürich — 東京: cite the source")
    ]
    assert all(isinstance(f, FeedbackRecord) and f.session_id == sid for f in got)
    assert all(f.question == "What language did Haymo's era translate into?" and f.created_at for f in got)
    with pytest.raises(AttributeError):
        got[0].note = "changed"  # type: ignore[misc]


def test_feedback_can_be_given_on_failed_and_running_sessions(log: SessionLog) -> None:
    failed = session(log, "q", status="failed")
    running = session(log, "q", status="running")
    log.add_feedback(failed, "down", "It crashed.")
    log.add_feedback(running, "up", "")
    assert [f.note for f in log.feedback(failed)] == ["It crashed."]
    assert [f.rating for f in log.feedback(running)] == ["up"]


def test_feedback_for_question_matches_the_normalised_question(log: SessionLog) -> None:
    a = session(log, "What language did Haymo's era translate into?")
    b = session(log, "  what LANGUAGE did   haymo's era translate into?\n")
    other = session(log, "Who founded Zürich?")
    quiet = session(log, "What language did Haymo's era translate into?")  # same question, no feedback
    log.add_feedback(a, "down", "Give the year.")
    log.add_feedback(other, "down", "Wrong city.")
    log.add_feedback(b, None, "Cite the chronicle.")
    found = log.feedback_for_question("WHAT language did Haymo's era translate into?")
    assert [(f.session_id, f.note) for f in found] == [(a, "Give the year."), (b, "Cite the chronicle.")]
    assert quiet not in {f.session_id for f in found}
    assert [f.note for f in log.feedback_for_question("who founded zürich?")] == ["Wrong city."]
    assert log.feedback_for_question("Never asked") == []
    assert log.feedback(quiet) == []


@pytest.mark.parametrize(
    ("rating", "note", "message"),
    [
        ("UP", "", "rating must be"),
        ("meh", "fine", "rating must be"),
        ("", "fine", "rating must be"),
        (None, "", "a rating .* or a note"),
        (None, "   \n\t ", "a rating .* or a note"),
        ("down", "x" * (MAX_FEEDBACK_NOTE + 1), "at most 2,000"),
        ("down", 42, "must be a str"),
    ],
)
def test_bad_feedback_is_refused_and_nothing_is_written(
    log: SessionLog, rating: object, note: object, message: str
) -> None:
    sid = session(log, "q")
    with pytest.raises(InvalidInput, match=message) as caught:
        log.add_feedback(sid, rating, note)  # type: ignore[arg-type]
    assert isinstance(caught.value, ValueError)
    assert log.feedback(sid) == [] and rows(log) == 0


def test_a_note_of_exactly_the_limit_after_stripping_is_accepted(log: SessionLog) -> None:
    sid = session(log, "q")
    log.add_feedback(sid, "down", "  " + "y" * MAX_FEEDBACK_NOTE + "  ")
    assert len(log.feedback(sid)[0].note) == MAX_FEEDBACK_NOTE


def test_unknown_session_is_refused_and_nothing_is_written(log: SessionLog) -> None:
    session(log, "q")
    with pytest.raises(SessionNotFound):
        log.add_feedback("no-such-session", "down", "missing the year")
    with pytest.raises(SessionNotFound):
        log.feedback("no-such-session")
    assert rows(log) == 0


def test_the_schema_itself_refuses_a_bad_rating_or_an_empty_row(log: SessionLog) -> None:
    """Past the Python checks, the table's own constraints refuse bad rows (mapped to InvalidInput, rolled back)."""
    sid = session(log, "q")
    for rating, note in (("sideways", "x"), (None, "")):
        with pytest.raises(InvalidInput, match="(?i)check"), log.transaction(write=True) as conn:
            conn.execute("INSERT INTO feedback (session_id, rating, note, created_at) VALUES (?, ?, ?, 't')",
                         (sid, rating, note))
    with pytest.raises(InvalidInput, match="(?i)foreign key"), log.transaction(write=True) as conn:
        conn.execute("INSERT INTO feedback (session_id, rating, note, created_at) VALUES ('ghost', 'up', '', 't')")
    assert rows(log) == 0
