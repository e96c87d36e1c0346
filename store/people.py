"""The user-scoped view of the store: what one person may list, open, export and give feedback on.

Privacy is enforced here, in the queries, not by hiding buttons: a person sees only sessions (and thread rows and
feedback) they own; an admin sees everyone's and may filter by owner. Someone else's session id is answered exactly
like a missing one (`SessionNotFound`, "no session with id ..."), so ids cannot be probed.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from store.errors import SessionNotFound
from store.records import SessionRecord, normalise_question
from store.session_log import FeedbackRecord, JudgementRecord, SessionLog, SessionSummary
from store.session_log.codec import text_out
from store.threads import ChatThreads


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who is looking: their user id and whether they are an admin."""

    user_id: str
    admin: bool = False


class ScopedStore:
    """The session log and chat threads as one viewer may see them."""

    def __init__(self, log: SessionLog, viewer: Viewer) -> None:
        self.log = log
        self.viewer = viewer
        self._threads = ChatThreads(log)

    @property
    def _owner_filter(self) -> str | None:
        return None if self.viewer.admin else self.viewer.user_id

    def owner_of(self, session_id: str) -> str:
        """The owner of a session this viewer may see. Raises SessionNotFound otherwise (missing or not theirs)."""
        with self.log.transaction(write=False) as conn:
            row = conn.execute("SELECT owner FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
        if row is None or (not self.viewer.admin and row[0] != self.viewer.user_id):
            raise SessionNotFound(session_id)
        return str(row[0])

    def list_sessions(self, limit: int = 50, status: str | None = None, sources: Collection[str] | None = None,
                      user: str | None = None) -> list[SessionSummary]:
        """Newest first: the viewer's own sessions; an admin's view is everyone's, or `user`'s when given (a
        non-admin asking for another user's gets their own filter, never the other's)."""
        owner = (user if user is not None else None) if self.viewer.admin else self.viewer.user_id
        return self.log.list_sessions(limit=limit, status=status, sources=sources, owner=owner)

    def owners(self) -> list[str]:
        """Everyone who owns a session, for an admin's filter; a non-admin gets only themselves."""
        if not self.viewer.admin:
            return [self.viewer.user_id]
        with self.log.transaction(write=False) as conn:
            rows = conn.execute("SELECT DISTINCT owner FROM sessions ORDER BY owner").fetchall()
        return [str(r[0]) for r in rows]

    def get(self, session_id: str) -> SessionRecord:
        """The whole session (for display and export). Raises SessionNotFound when missing or not the viewer's."""
        self.owner_of(session_id)
        return self.log.get(session_id)

    def judgements(self, session_id: str) -> list[JudgementRecord]:
        """The session's judgements. Raises SessionNotFound when missing or not the viewer's."""
        self.owner_of(session_id)
        return self.log.judgements(session_id)

    def feedback(self, session_id: str) -> list[FeedbackRecord]:
        """Feedback on the session. Raises SessionNotFound when missing or not the viewer's."""
        self.owner_of(session_id)
        return self.log.feedback(session_id)

    def add_feedback(self, session_id: str, rating: str | None, note: str) -> int:
        """Feedback from the viewer on a session they own (admins on any). Raises SessionNotFound otherwise."""
        self.owner_of(session_id)
        return self.log.add_feedback(session_id, rating, note, owner=self.viewer.user_id)

    def thread_of(self, session_id: str) -> str | None:
        """The chat thread of a session the viewer may see. Raises SessionNotFound otherwise."""
        self.owner_of(session_id)
        return self._threads.thread_of(session_id)

    def thread_sessions(self, thread_id: str) -> list[str]:
        """The thread's sessions the viewer may see, in order (empty for a thread that is not theirs)."""
        return self._threads.sessions(thread_id, owner=self._owner_filter)

    def set_learning(self, session_id: str, learn: bool) -> None:
        """The per-session consent toggle: whether this session may be judged, trained on and reflected into the
        bank (the person's own setting still applies on top). Raises SessionNotFound when not the viewer's."""
        self.owner_of(session_id)
        with self.log.transaction(write=True) as conn:
            conn.execute("UPDATE sessions SET training_opt_out = ? WHERE session_id = ? AND source NOT IN "
                         "('eval', 'probe')", (int(not learn), session_id))


class SessionOwners:
    """Who owns which session, read from the session log: the app's rubric bank counts an item for the same question
    only when its session is the asker's own (`store.rubric_bank.RubricBank`, issue 34)."""

    _CHUNK = 500  # ids per query: well under SQLite's and PostgreSQL's parameter limits

    def __init__(self, log: SessionLog) -> None:
        self.log = log

    def owners_of(self, session_ids: Sequence[str]) -> dict[str, str]:
        """{session id: owner} for the ids that exist (a deleted or unknown session is left out)."""
        ids = sorted(set(session_ids))
        found: dict[str, str] = {}
        with self.log.transaction(write=False) as conn:
            for start in range(0, len(ids), self._CHUNK):
                chunk = ids[start:start + self._CHUNK]
                marks = ", ".join("?" * len(chunk))
                rows = conn.execute(f"SELECT session_id, owner FROM sessions WHERE session_id IN ({marks})",
                                    tuple(chunk)).fetchall()
                found.update({str(r[0]): str(r[1]) for r in rows})
        return found

    def sessions_of(self, owner: str) -> list[str]:
        """Every session `owner` owns: the bank searches a person's own items among them (`RubricBank.search_own`),
        so what a person is shown of the bank depends on their own data only (issue 65)."""
        with self.log.transaction(write=False) as conn:
            rows = conn.execute("SELECT session_id FROM sessions WHERE owner = ?", (owner,)).fetchall()
        return [str(r[0]) for r in rows]

    def unshared_with(self, asker: str, session_ids: Sequence[str]) -> set[str]:
        """The sessions among `session_ids` whose bank items may not reach `asker`'s prompt (issue 65): those of a
        team other than the asker's current one that does not share (`teams.share_global`, the team's one opt-in to
        let its data past its members), a removed team's included. Sessions of no team, and unknown ids (imported
        or seed items), are shared with everyone."""
        ids = sorted(set(session_ids))
        teams: dict[str, tuple[str, bool]] = {}
        with self.log.transaction(write=False) as conn:
            row = conn.execute("SELECT team FROM users WHERE user_id = ?", (asker,)).fetchone()
            own_team = None if row is None or row[0] is None else str(row[0])
            sharing = {str(r[0]) for r in conn.execute("SELECT name FROM teams WHERE share_global = 1").fetchall()}
            for start in range(0, len(ids), self._CHUNK):
                chunk = ids[start:start + self._CHUNK]
                marks = ", ".join("?" * len(chunk))
                rows = conn.execute(f"SELECT session_id, team, share_global FROM sessions WHERE session_id IN "
                                    f"({marks}) AND team IS NOT NULL", tuple(chunk)).fetchall()
                teams.update({str(r[0]): (str(r[1]), r[2] == 1) for r in rows})
        # A team shares a session only if it shared when the session was asked (`sessions.share_global`, migration
        # 0014) and still does: opting in later never hands over what was asked before.
        return {sid for sid, (team, shared_then) in teams.items()
                if team != own_team and not (shared_then and team in sharing)}


def own_feedback(log: SessionLog, question: str, owner: str) -> list[FeedbackRecord]:
    """The notes `owner` gave on their own learnable sessions whose question is the same after normalisation, oldest
    first: what the judge may turn into rubrics for `owner`'s sessions of that question, and for nobody else's
    (issue 34: one person's notes never score another person's answers; `learning.judge.pipeline`)."""
    key = normalise_question(question)
    learnable, consent = log.learnable_sql("s")
    with log.transaction(write=False) as conn:
        rows = conn.execute(
            "SELECT f.feedback_id, f.session_id, s.question, f.rating, f.note, f.created_at FROM feedback f "
            f"JOIN sessions s ON s.session_id = f.session_id WHERE {learnable} AND s.owner = ? AND f.owner = ? "
            "ORDER BY f.feedback_id", (*consent, owner, owner)).fetchall()
    return [FeedbackRecord(feedback_id=int(r[0]), session_id=str(r[1]), question=text_out(r[2]), rating=r[3],
                           note=text_out(r[4]), created_at=str(r[5]))
            for r in rows if normalise_question(text_out(r[2])) == key]
