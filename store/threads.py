"""Chat threads of the research UI: which sessions were asked, in order, in one conversation (migration 0006).

A follow-up is its own research session (judged, reflected on and trained on like any other); the thread only
records where it was asked so the UI can reopen the conversation.
"""

from __future__ import annotations

import uuid

from store.errors import StoreError
from store.session_log import SessionLog


class ThreadError(StoreError):
    """A thread operation is not possible (unknown session, session already in a thread)."""


class ChatThreads:
    """Thread membership over a SessionLog's database."""

    def __init__(self, log: SessionLog) -> None:
        self.log = log

    @staticmethod
    def new_id() -> str:
        """A fresh thread id."""
        return "thr_" + uuid.uuid4().hex[:16]

    def add(self, thread_id: str, session_id: str) -> int:
        """Append a session to a thread (a new thread id starts one); returns its position (0 = opening question).

        Raises:
            ThreadError: the session does not exist or already belongs to a thread.
        """
        if not thread_id.strip():
            raise ThreadError("a thread id must not be empty")
        with self.log.transaction(write=True) as conn:
            if conn.execute("SELECT 1 FROM sessions WHERE session_id = ?", (session_id,)).fetchone() is None:
                raise ThreadError(f"unknown session {session_id!r}")
            # Checked before the insert (under the write lock, so no race): a failed statement would abort a
            # PostgreSQL transaction, and the check reads the same on both backends.
            if conn.execute("SELECT 1 FROM chat_threads WHERE session_id = ?", (session_id,)).fetchone():
                raise ThreadError(f"session {session_id!r} already belongs to a thread")
            (position,) = conn.execute(
                "SELECT COALESCE(MAX(position) + 1, 0) FROM chat_threads WHERE thread_id = ?", (thread_id,)
            ).fetchone()
            conn.execute(  # the thread row belongs to whoever owns the session
                "INSERT INTO chat_threads (session_id, thread_id, position, owner, created_at) "
                "SELECT ?, ?, ?, owner, ? FROM sessions WHERE session_id = ?",
                (session_id, thread_id, position, self.log.now(), session_id),
            )
        return int(position)

    def sessions(self, thread_id: str, owner: str | None = None) -> list[str]:
        """The thread's session ids in the order they were asked (empty for an unknown thread), only `owner`'s
        when given (`store.people.ScopedStore` passes the viewer's id for everyone but admins)."""
        with self.log.transaction(write=False) as conn:
            rows = conn.execute(
                "SELECT session_id FROM chat_threads WHERE thread_id = ? "
                f"{'' if owner is None else 'AND owner = ? '}ORDER BY position",
                (thread_id,) if owner is None else (thread_id, owner),
            ).fetchall()
        return [r[0] for r in rows]

    def thread_of(self, session_id: str) -> str | None:
        """The thread a session was asked in, or None (sessions from the CLI or batch have none)."""
        with self.log.transaction(write=False) as conn:
            row = conn.execute("SELECT thread_id FROM chat_threads WHERE session_id = ?", (session_id,)).fetchone()
        return row[0] if row else None
