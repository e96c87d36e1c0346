"""User feedback on a session's answer: thumbs up/down and notes, read back per session or per question."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from store.errors import InvalidInput
from store.records import normalise_question
from store.session_log.codec import text_in, text_out
from store.session_log.connection import SessionLogBase

FEEDBACK_RATINGS: tuple[str, ...] = ("up", "down")
MAX_FEEDBACK_NOTE = 2000  # characters, after stripping


@dataclass(frozen=True, slots=True)
class FeedbackRecord:
    """One piece of user feedback on a session's answer: a thumbs up/down and/or a note."""

    feedback_id: int
    session_id: str
    question: str  # the session's question, verbatim
    rating: Literal["up", "down"] | None
    note: str  # stripped; "" when only a rating was given
    created_at: str


def _feedback_record(row: Sequence[Any]) -> FeedbackRecord:
    return FeedbackRecord(feedback_id=int(row[0]), session_id=row[1], question=text_out(row[2]), rating=row[3],
                          note=text_out(row[4]), created_at=row[5])


class FeedbackMixin(SessionLogBase):
    """Feedback writes and reads; a session (of any status) may collect several pieces."""

    def add_feedback(self, session_id: str, rating: str | None, note: str, owner: str | None = None) -> int:
        """Store a user's feedback on a session (any status); a session may collect several. Returns its id.

        Args:
            session_id: The session the feedback is about.
            rating: "up", "down" or None (a note without a thumb).
            note: Free text, "what was missing or wrong"; stripped, at most MAX_FEEDBACK_NOTE characters, may be
                empty when a rating is given.
            owner: Who gave it; defaults to the session's owner (people give feedback only on their own sessions,
                `store.people.ScopedStore`).

        Raises:
            InvalidInput: Unknown rating, a note that is not a str or too long, or neither a rating nor a note
                (nothing was written).
            SessionNotFound: Unknown id.
        """
        if rating is not None and rating not in FEEDBACK_RATINGS:
            raise InvalidInput(f"feedback rating must be 'up', 'down' or None, got {rating!r:.80}")
        if not isinstance(note, str):
            raise InvalidInput(f"feedback note must be a str, got {type(note).__name__}")
        text = note.strip()
        if len(text) > MAX_FEEDBACK_NOTE:
            raise InvalidInput(f"feedback note is {len(text):,} characters long; at most {MAX_FEEDBACK_NOTE:,} allowed")
        if rating is None and not text:
            raise InvalidInput("feedback needs a rating ('up' or 'down') or a note")
        stored = text_in(text, "feedback note")
        now = self._now()
        with self._transaction("IMMEDIATE") as conn:
            self._status(conn, session_id)
            if owner is None:
                owner = str(conn.execute("SELECT owner FROM sessions WHERE session_id = ?",
                                         (session_id,)).fetchone()[0])
            row = conn.execute(
                "INSERT INTO feedback (session_id, rating, note, owner, created_at) VALUES (?, ?, ?, ?, ?) "
                "RETURNING feedback_id",
                (session_id, rating, stored, owner, now),
            ).fetchone()
            return int(row[0])

    def feedback(self, session_id: str) -> list[FeedbackRecord]:
        """Every piece of feedback on a session, oldest first.

        Raises:
            SessionNotFound: Unknown id.
        """
        with self._transaction("DEFERRED") as conn:
            self._status(conn, session_id)
            rows = conn.execute(
                "SELECT f.feedback_id, f.session_id, s.question, f.rating, f.note, f.created_at FROM feedback f "
                "JOIN sessions s ON s.session_id = f.session_id WHERE f.session_id = ? ORDER BY f.feedback_id",
                (session_id,),
            ).fetchall()
        return [_feedback_record(r) for r in rows]

    def feedback_for_question(self, question: str) -> list[FeedbackRecord]:
        """Feedback on every learnable session (`learnable_sql`) whose question is the same after normalisation
        (`normalise_question`), oldest first.

        The sessions table keeps no question hash, so sessions with feedback are matched here in Python: feedback
        rows are few (one per user action), so this stays cheap.

        Raises:
            InvalidInput: `question` is not a str.
        """
        if not isinstance(question, str):
            raise InvalidInput(f"question must be a str, got {type(question).__name__}")
        key = normalise_question(question)
        # The judge turns these notes into rubrics for everyone's sessions of the question: only notes on sessions
        # that may be learned from (their owner consents, not opted out) are used.
        learnable, consent = self.learnable_sql("s")
        with self._transaction("DEFERRED") as conn:
            rows = conn.execute(
                "SELECT f.feedback_id, f.session_id, s.question, f.rating, f.note, f.created_at FROM feedback f "
                f"JOIN sessions s ON s.session_id = f.session_id WHERE {learnable} ORDER BY f.feedback_id",
                consent,
            ).fetchall()
        return [_feedback_record(r) for r in rows if normalise_question(text_out(r[2])) == key]
