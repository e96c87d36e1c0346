"""Durable sessions (issue 21): where a service's checkpoints go, and the rules of resuming.

Every session the service runs is one LangGraph thread (thread id = session id) whose steps are checkpointed in a
SQLite file beside the session log's (`<data>/checkpoints.sqlite3`), or in the store's PostgreSQL database. The
session log still gets every turn the moment it exists; a resume first drops the turns a killed process wrote after
its last checkpoint (`SessionRuns.truncate`), so each turn is in the log exactly once and the trajectory stays one
contiguous token sequence.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

from agent.checkpoint import CheckpointTarget, open_checkpointer
from agent.errors import InputError
from store.config import StoreConfig
from store.errors import SessionNotRunning, StorageError
from store.session_log import SessionLog
from store.session_log.checkpoints import RunState, SessionRuns

CHECKPOINT_FILE = "checkpoints.sqlite3"


class ResumeError(InputError):
    """A session that cannot be resumed (unknown, finished, or not durable; or another resume has taken it over);
    nothing was changed."""


ClarifyMode = Literal["auto", "on", "off"]


def clarify_default(mode: ClarifyMode, policy_backend: str) -> bool:
    """Whether sessions ask a clarifying question before planning by default: `auto` is on for endpoint policies
    (vLLM, llama.cpp, any OpenAI-compatible server) and off for the embedded in-process model."""
    if mode == "auto":
        return policy_backend != "embedded"
    return mode == "on"


def checkpoint_target(store: StoreConfig) -> CheckpointTarget:
    """PostgreSQL when the store is PostgreSQL, else a SQLite file beside the store's."""
    if store.database_url is not None:
        url = store.database_url
        return CheckpointTarget(database_url=url.get_secret_value() if hasattr(url, "get_secret_value") else str(url))
    return CheckpointTarget(sqlite_path=Path(store.sqlite_path).with_name(CHECKPOINT_FILE))


@dataclass
class DurableSessions:
    """What a ResearchService needs to checkpoint its sessions."""

    target: CheckpointTarget
    runs: SessionRuns
    keep_checkpoints: bool = False
    approval_expiry_s: float = 86400.0
    clarify: bool = False  # interactive sessions ask a clarifying question before planning (sessions.clarify)

    @classmethod
    def for_store(cls, log: SessionLog, store: StoreConfig, *, keep_checkpoints: bool = False,
                  approval_expiry_s: float = 86400.0, clarify: bool = False) -> DurableSessions:
        return cls(checkpoint_target(store), SessionRuns(log), keep_checkpoints, approval_expiry_s, clarify)

    def expiry(self, now: datetime | None = None) -> str:
        """When a plan paused now stops waiting (ISO-8601 UTC)."""
        at = (now or datetime.now(UTC)) + timedelta(seconds=self.approval_expiry_s)
        return at.isoformat(timespec="seconds")


def expiry_reason(run: RunState) -> str:
    """Why a paused session ended when its pause expired."""
    what = ("the clarifying question waited for an answer" if run.pause_kind == "clarification"
            else "the plan waited for approval")
    return f"{what} past {run.expires_at} and expired"


def mark_expired(log: SessionLog, run: RunState) -> str:
    """End a session whose pause has expired: failed, its run state 'expired' with the reason. Every path that lists,
    offers or resumes a pause calls this, so an expired pause can never be answered. Returns the reason."""
    reason = expiry_reason(run)
    try:
        log.finish(run.session_id, "failed", error=reason, metrics={"interrupted": "expired"})
    except SessionNotRunning:  # another path ended it first: the run state still says why
        pass
    SessionRuns(log).set_state(run.session_id, "expired", reason=reason)
    return reason


def end_if_expired(log: SessionLog, durable: DurableSessions, run: RunState | None) -> str | None:
    """Outside a running event loop (the CLI before a resume, the UI's form): end a session whose pause expired and
    prune its checkpoints (unless kept). Returns the reason, or None when the pause has not expired."""
    if run is None or not run.expired():
        return None
    reason = mark_expired(log, run)
    asyncio.run(prune_ended(durable, run.thread_id))
    return reason


async def prune_ended(durable: DurableSessions, thread_id: str) -> None:
    """Delete an ended session's checkpoints unless they are kept; a failure here is ignored (leftover checkpoints
    cost disk, not correctness)."""
    if durable.keep_checkpoints:
        return
    with contextlib.suppress(Exception):
        await _delete_threads(durable.target, [thread_id])


async def _delete_threads(target: CheckpointTarget, thread_ids: Sequence[str]) -> None:
    async with open_checkpointer(target) as saver:
        for tid in thread_ids:
            await saver.adelete_thread(tid)


def purge_checkpoints(store: StoreConfig, session_ids: Sequence[str]) -> int:
    """Delete the LangGraph checkpoints of these sessions; returns how many threads were asked to go.

    A person's deletion calls this before it deletes their rows: a running or paused session's checkpoint holds
    their question, plan and evidence, and outside the store's transaction it would outlive the rows. Done first,
    a failure here stops the deletion with nothing deleted; a checkpoint file that was never created is left alone.
    """
    target = checkpoint_target(store)
    if not session_ids or (target.sqlite_path is not None and not target.sqlite_path.exists()):
        return 0

    try:
        asyncio.run(_delete_threads(target, session_ids))
    except Exception as exc:  # noqa: BLE001 - aiosqlite/psycopg errors become the store's typed error
        raise StorageError(f"could not delete the sessions' checkpoints at {target.location}: "
                           f"{type(exc).__name__}") from exc
    return len(session_ids)
