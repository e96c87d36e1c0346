"""Judgements of completed sessions (and the sessions still to judge), and the per-question rubric buffers."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from store.errors import DeletedMeanwhile, InvalidInput, SessionNotCompleted
from store.session_log.codec import iso, label_in, mapping_in
from store.session_log.connection import SessionLogBase


@dataclass(frozen=True, slots=True)
class JudgementRecord:
    """One stored judgement (or recorded judging failure) of a session."""

    judgement_id: int
    session_id: str
    judge_model: str
    payload: dict[str, Any]
    status: str  # "ok" | "failed"
    error: str | None
    judge_kind: str
    rubric_version: str
    created_at: str


class JudgementsMixin(SessionLogBase):
    """Judge results per session, the queue of completed sessions not yet judged, and rubric-buffer persistence."""

    def record_judgement(
        self,
        session_id: str,
        judge_model: str,
        payload: Mapping[str, object],
        *,
        status: Literal["ok", "failed"] = "ok",
        error: str | None = None,
        judge_kind: str = "llm",
        rubric_version: str = "",
    ) -> int:
        """Store a judgement of a completed session; returns its id.

        An "ok" judgement takes the session out of `completed_unjudged`; a "failed" one is a recorded failure (with
        its error), and the session is offered for judging again.

        Raises:
            InvalidInput: Bad model name, payload, status or kind (nothing was written).
            SessionNotFound: Unknown id.
            SessionNotCompleted: The session is running or failed.
        """
        if status not in ("ok", "failed"):
            raise InvalidInput(f"judgement status must be 'ok' or 'failed', got {status!r}")
        if status == "failed" and not error:
            raise InvalidInput("a failed judgement needs an error message")
        values = (
            label_in(judge_model, "judge_model"),
            mapping_in(payload, "payload"),
            status,
            error,
            label_in(judge_kind, "judge_kind"),
            label_in(rubric_version, "rubric_version", allow_empty=True),
        )
        now = self._now()
        with self._transaction("IMMEDIATE") as conn:
            current = self._status(conn, session_id)
            if current != "completed":
                raise SessionNotCompleted(session_id, current, "record a judgement")
            row = conn.execute(
                "INSERT INTO judgements (session_id, judge_model, payload_json, status, error, judge_kind, "
                "rubric_version, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING judgement_id",
                (session_id, *values, now),
            ).fetchone()
            return int(row[0])

    def judgements(self, session_id: str) -> list[JudgementRecord]:
        """Every judgement of a session, oldest first (failed attempts included)."""
        with self._transaction("DEFERRED") as conn:
            self._status(conn, session_id)
            rows = conn.execute(
                "SELECT judgement_id, judge_model, payload_json, status, error, judge_kind, rubric_version, created_at "
                "FROM judgements WHERE session_id = ? ORDER BY judgement_id",
                (session_id,),
            ).fetchall()
        return [
            JudgementRecord(int(r[0]), session_id, r[1], json.loads(r[2]), r[3], r[4], r[5], r[6], r[7]) for r in rows
        ]

    def completed_unjudged(self, since: datetime | None = None, limit: int | None = None) -> list[str]:
        """Ids of completed sessions without any judgement that may be learned from, oldest completion first.

        Opted-out sessions (a user's choice, benchmark runs, gate probes) and sessions of people who do not consent
        (`learnable_sql`) are never judged for training.

        Args:
            since: Only sessions that finished at or after this moment (naive datetimes are taken as UTC).
            limit: At most this many ids; None for all.

        Raises:
            InvalidInput: `limit` < 1 or `since` not a datetime.
        """
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise InvalidInput(f"limit must be None or an int >= 1, got {limit!r}")
        if since is not None and not isinstance(since, datetime):
            raise InvalidInput(f"since must be a datetime, got {type(since).__name__}")
        learnable, consent = self.learnable_sql("s")
        with self._transaction("DEFERRED") as conn:
            rows = conn.execute(
                f"SELECT s.session_id FROM sessions s WHERE s.status = 'completed' AND {learnable} "
                "AND s.finished_at >= ? "
                "AND NOT EXISTS (SELECT 1 FROM judgements j WHERE j.session_id = s.session_id AND j.status = 'ok') "
                f"ORDER BY s.finished_at, s.rowid{'' if limit is None else ' LIMIT ?'}",
                (*consent, "" if since is None else iso(since), *(() if limit is None else (limit,))),
            ).fetchall()
        return [str(r[0]) for r in rows]

    def deletion_epoch(self) -> int:
        """How many data deletions this store has recorded (it only grows; `store.deletion` writes one row each).

        A writer of something derived from people's data (a judge's rubric buffer) reads it BEFORE it reads that
        data, and hands it to the save: a save that finds it grown writes nothing (`DeletedMeanwhile`)."""
        with self._transaction("DEFERRED") as conn:
            return _deletion_epoch(conn)

    def save_rubric_buffer(self, question_sha: str, question: str, payload: Mapping[str, object], *,
                           deletions_seen: int | None = None) -> int:
        """Insert or replace the rubric buffer of a question; returns its new version (1, 2, ...).

        `deletions_seen`: the `deletion_epoch()` read before the sessions and the buffer this payload was made
        from. Checked in the write's own transaction (writes are serialised, so a deletion commits wholly before or
        after it): when a deletion was recorded since, the payload may hold the question text and rubrics of
        sessions that are gone, so nothing is written. None skips the check (a buffer from no one's sessions).

        Raises:
            DeletedMeanwhile: a deletion was recorded since `deletions_seen` (nothing written).
        """
        values = (label_in(question_sha, "question_sha"), mapping_in(payload, "payload"))
        now = self._now()
        with self._transaction("IMMEDIATE") as conn:
            if deletions_seen is not None:
                epoch = _deletion_epoch(conn)
                if epoch != deletions_seen:
                    raise DeletedMeanwhile(f"{epoch - deletions_seen} data deletion(s) were recorded since this "
                                           "rubric buffer was read; it is not saved")
            row = conn.execute("SELECT version FROM rubric_buffers WHERE question_sha = ?", (values[0],)).fetchone()
            version = int(row[0]) + 1 if row else 1
            conn.execute(
                "INSERT INTO rubric_buffers (question_sha, question, payload_json, version, updated_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (question_sha) DO UPDATE SET question = excluded.question, "
                "payload_json = excluded.payload_json, version = excluded.version, updated_at = excluded.updated_at",
                (values[0], question, values[1], version, now),
            )
            return version

    def load_rubric_buffer(self, question_sha: str) -> tuple[dict[str, Any], int] | None:
        """The saved buffer payload of a question and its version, or None."""
        with self._transaction("DEFERRED") as conn:
            row = conn.execute(
                "SELECT payload_json, version FROM rubric_buffers WHERE question_sha = ?", (question_sha,)
            ).fetchone()
        return (json.loads(row[0]), int(row[1])) if row else None


def _deletion_epoch(conn: Any) -> int:
    """The deletion records counted inside the caller's transaction (one row per data deletion; it only grows)."""
    return int(conn.execute("SELECT COUNT(*) FROM data_deletions").fetchone()[0])
