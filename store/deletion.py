"""Deleting a person's data, down to what was derived from it (issue 18).

One database transaction removes their sessions with turns, tool calls, snippets, judgements, feedback, chat-thread
rows and reflection candidates, the judge's rubric buffers of their questions, and (unless kept) their account; it
records the deletion (a SHA-256 of the subject, who asked, when, how many rows per table; never content) and marks
the policy versions whose training window held their learnable sessions, and versions trained from those. A failure
anywhere rolls all of it back: never half-deleted.

Rubric-bank items reflected from their sessions live in Chroma, outside that transaction. Their ids (and the session
ids, random hex, which also find items stored under another id) stay listed on the deletion record until a removal
succeeds; the removal is idempotent, so `resume_deletions` (run again by every later deletion, and by
`rubricem users delete-data`) finishes an interrupted one.

What a trained adapter learned cannot be taken out of it: the marks say which versions that concerns.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from store.db import Connection
from store.records import normalise_question, question_sha, sha256_text
from store.session_log import SessionLog
from store.session_log.codec import text_out
from store.users import UnknownUser, check_user_id

# Child tables first; each keyed by session. feedback also by its giver (their notes on an admin's... own sessions).
_SESSION_TABLES = ("snippets", "tool_calls", "turns", "judgements", "feedback", "chat_threads",
                   "reflection_candidates")
_OWNED = "SELECT session_id FROM sessions WHERE owner = ?"


class DerivedBank(Protocol):
    """The part of the rubric bank a deletion needs (`store.rubric_bank.RubricBank` has it)."""

    def delete_derived(self, session_ids: Sequence[str], item_ids: Sequence[str] = ()) -> int: ...


@dataclass(frozen=True, slots=True)
class DeletionResult:
    """What one deletion removed and marked."""

    deletion_id: str
    counts: Mapping[str, int]  # rows removed per table
    bank_items_removed: int
    bank_pending: bool  # the bank part is still to do (no bank given, or it failed): `resume_deletions` retries it
    marked_versions: tuple[str, ...]  # policy versions trained on data now deleted


def subject_sha(user_id: str) -> str:
    """How a deletion record names whose data it was: an auditor holding the id can check it, the row cannot be
    read back into a name."""
    return sha256_text("rubricem-user:" + check_user_id(user_id))


def _affected_versions(conn: Connection, owner: str) -> list[str]:
    learned = [str(r[0]) for r in conn.execute(
        "SELECT finished_at FROM sessions WHERE owner = ? AND status = 'completed' AND training_opt_out = 0 "
        "AND finished_at IS NOT NULL", (owner,)).fetchall()]
    versions = conn.execute("SELECT name, parent, data_window_json FROM policy_versions").fetchall()
    # Conservative: a window that held any of their learnable sessions counts, whatever their consent was then.
    hit: set[str] = set()
    for name, _parent, window_json in versions:
        window = json.loads(window_json or "{}")
        end = window.get("end")
        if end is None:
            continue
        start = window.get("start") or ""
        if any(start < f <= end for f in learned):
            hit.add(str(name))
    grew = True
    while grew:  # a version trained from a marked one carries what its parent learned
        grew = False
        for name, parent, _ in versions:
            if parent in hit and name not in hit:
                hit.add(str(name))
                grew = True
    return sorted(hit)


def owned_sessions(log: SessionLog, user_id: str) -> list[str]:
    """Ids of every session `user_id` owns (what a deletion will remove): for purging what lives outside this
    database first, such as the LangGraph checkpoints of their running or paused sessions (`app.durable`)."""
    owner = check_user_id(user_id)
    with log.transaction(write=False) as conn:
        return [str(r[0]) for r in conn.execute(_OWNED, (owner,)).fetchall()]


def delete_user_data(log: SessionLog, user_id: str, *, requested_by: str, bank: DerivedBank | None = None,
                     keep_account: bool = False) -> DeletionResult:
    """Delete everything of `user_id` (see the module docstring); returns what was removed.

    Args:
        log: The store.
        user_id: Whose data.
        requested_by: Who asked (an admin's id, or the person themselves; recorded as "self" then).
        bank: The rubric bank; None leaves the bank part pending (a later `resume_deletions` does it).
        keep_account: Keep their `users` row (the UI's "delete my data" keeps the person logged in).

    Raises:
        InvalidInput: not a usable user id.
        UnknownUser: nobody with that id and no data owned by it (nothing written).
    """
    owner = check_user_id(user_id)
    actor = "self" if check_user_id(requested_by) == owner else check_user_id(requested_by)
    deletion_id = f"del-{uuid.uuid4().hex[:16]}"
    with log.transaction(write=True) as conn:
        account = conn.execute("SELECT 1 FROM users WHERE user_id = ?", (owner,)).fetchone() is not None
        sessions = [str(r[0]) for r in conn.execute(_OWNED, (owner,)).fetchall()]
        given = int(conn.execute("SELECT COUNT(*) FROM feedback WHERE owner = ?", (owner,)).fetchone()[0])
        if not account and not sessions and not given:
            raise UnknownUser(owner)
        items = sorted({str(r[0]) for r in conn.execute(
            f"SELECT bank_item_id FROM reflection_candidates WHERE bank_item_id IS NOT NULL AND session_id IN ({_OWNED})",
            (owner,)).fetchall()})
        marked = _affected_versions(conn, owner)
        shas = {question_sha(normalise_question(text_out(r[0])))
                for r in conn.execute("SELECT question FROM sessions WHERE owner = ?", (owner,)).fetchall()}
        counts: dict[str, int] = {}
        for table in _SESSION_TABLES:  # table names are ours, not input
            extra = " OR owner = ?" if table == "feedback" else ""
            cur = conn.execute(f"DELETE FROM {table} WHERE session_id IN ({_OWNED}){extra}",
                               (owner, owner) if extra else (owner,))
            counts[table] = max(cur.rowcount, 0)
        counts["sessions"] = max(conn.execute("DELETE FROM sessions WHERE owner = ?", (owner,)).rowcount, 0)
        counts["rubric_buffers"] = sum(
            max(conn.execute("DELETE FROM rubric_buffers WHERE question_sha = ?", (sha,)).rowcount, 0) for sha in shas)
        counts["users"] = 0 if keep_account else max(
            conn.execute("DELETE FROM users WHERE user_id = ?", (owner,)).rowcount, 0)
        pending = {"sessions": sessions, "items": items} if sessions or items else {}
        conn.execute(
            "INSERT INTO data_deletions (deletion_id, subject_sha, requested_by, counts_json, pending_bank_json, "
            "created_at, bank_done_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (deletion_id, subject_sha(owner), actor, json.dumps(counts, sort_keys=True), json.dumps(pending),
             log.now(), None if pending else log.now()))
        conn.executemany("INSERT INTO version_data_deletions (version, deletion_id) VALUES (?, ?)",
                         [(v, deletion_id) for v in marked])
    removed, still_pending = 0, bool(pending)
    if bank is not None:
        done = resume_deletions(log, bank)
        removed, still_pending = done.get(deletion_id, 0), deletion_id not in done and bool(pending)
    return DeletionResult(deletion_id, counts, removed, still_pending, tuple(marked))


def resume_deletions(log: SessionLog, bank: DerivedBank) -> dict[str, int]:
    """Finish the bank part of every deletion still pending; returns {deletion id: items removed} for those done.

    A bank error propagates and leaves the rest pending (retried next time)."""
    with log.transaction(write=False) as conn:
        rows = conn.execute("SELECT deletion_id, pending_bank_json FROM data_deletions WHERE bank_done_at IS NULL "
                            "ORDER BY created_at").fetchall()
    done: dict[str, int] = {}
    for deletion_id, pending_json in rows:
        pending = json.loads(pending_json or "{}")
        removed = bank.delete_derived(pending.get("sessions", []), pending.get("items", []))
        with log.transaction(write=True) as conn:
            conn.execute("UPDATE data_deletions SET pending_bank_json = '{}', bank_done_at = ? WHERE deletion_id = ?",
                         (log.now(), deletion_id))
        done[str(deletion_id)] = removed
    return done


@dataclass(frozen=True, slots=True)
class DeletionRecord:
    """A recorded deletion, as an admin may list it (no content, no identity)."""

    deletion_id: str
    subject_sha: str
    requested_by: str
    counts: Mapping[str, int]
    created_at: str
    bank_done: bool
    versions: tuple[str, ...]


def deletions(log: SessionLog) -> list[DeletionRecord]:
    """Every recorded deletion, oldest first, with the versions it marked."""
    with log.transaction(write=False) as conn:
        rows = conn.execute("SELECT deletion_id, subject_sha, requested_by, counts_json, created_at, bank_done_at "
                            "FROM data_deletions ORDER BY created_at").fetchall()
        marks = conn.execute("SELECT deletion_id, version FROM version_data_deletions ORDER BY version").fetchall()
    by: dict[str, list[str]] = {}
    for deletion_id, version in marks:
        by.setdefault(str(deletion_id), []).append(str(version))
    return [DeletionRecord(str(r[0]), str(r[1]), str(r[2]), json.loads(r[3]), str(r[4]), r[5] is not None,
                           tuple(by.get(str(r[0]), ()))) for r in rows]


def versions_trained_on_deleted_data(log: SessionLog) -> dict[str, int]:
    """{policy version: how many deletions touched its training data}."""
    with log.transaction(write=False) as conn:
        rows = conn.execute("SELECT version, COUNT(*) FROM version_data_deletions GROUP BY version").fetchall()
    return {str(v): int(n) for v, n in rows}
