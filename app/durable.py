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
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

from agent.checkpoint import CheckpointTarget, open_checkpointer
from agent.errors import InputError
from store.config import StoreConfig
from store.errors import SessionNotRunning, StorageError
from store.session_log import LeaseSweep, SessionLease, SessionLog, process_lease_owner
from store.session_log.checkpoints import RunState, SessionRuns

CHECKPOINT_FILE = "checkpoints.sqlite3"
_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    """How often the running process renews a session's lease, and how long each renewal lasts (issue 34).

    The lease outlives several missed heartbeats, so a slow store write does not make a live run look gone; a
    killed process's sessions are taken to be gone `lease_s` after its last heartbeat.
    """

    heartbeat_s: float = 20.0
    lease_s: float = 90.0

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_s < self.lease_s:
            raise ValueError(f"the heartbeat ({self.heartbeat_s} s) must be shorter than the lease ({self.lease_s} s)")


class LeaseLost(RuntimeError):
    """Another process took this session over (our lease had lapsed): this run must stop without writing more."""


class Heartbeat:
    """Renews one session's lease on a daemon thread while the session runs in this process.

    A thread, not an asyncio task: a policy that holds the event loop for a long generation (the embedded model)
    must not let the lease lapse while the process is alive. It dies with the process, which is the point: then the
    lease expires and the session can be resumed elsewhere.
    """

    def __init__(self, log: SessionLog, session_id: str, timing: LeaseTiming, owner: str | None = None) -> None:
        self.log, self.session_id, self.timing = log, session_id, timing
        self.owner = owner or process_lease_owner()
        self.lost = False  # another process took the session over (our lease had expired): we stop renewing
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"rubricem-lease-{session_id[:8]}", daemon=True)

    def start(self) -> Heartbeat:
        self._renew()
        self._thread.start()
        return self

    def _renew(self) -> None:
        try:
            if not self.log.renew_lease(self.session_id, self.timing.lease_s, self.owner):
                self.lost = not self._stop.is_set() and self.log.lease(self.session_id).status == "running"
                if self.lost:
                    _log.error("session %s was taken over by another process: this one no longer holds its lease",
                               self.session_id)
                self._stop.set()
        except Exception as exc:  # noqa: BLE001 - a store hiccup: try again at the next beat, the lease has margin
            _log.warning("could not renew the lease of session %s: %s", self.session_id, exc)

    def _beat(self) -> None:
        while not self._stop.wait(self.timing.heartbeat_s):
            self._renew()

    def check(self) -> None:
        """The write fence, called before every turn and tool call is written: a run whose lease another process
        now holds (it lapsed while this process was frozen or cut off from the store, and a resume took it) stops
        here, so two processes never append to one trajectory.

        Raises:
            LeaseLost: the lease is someone else's.
        """
        if not self.lost:
            owner = self.log.lease(self.session_id).owner
            if owner is not None and owner != self.owner:
                self.lost = True
                _log.error("session %s was taken over by another process: this run stops writing", self.session_id)
        if self.lost:
            raise LeaseLost(f"session {self.session_id} was taken over by another process after this one's lease "
                            "lapsed: this run stopped without writing more (the other process goes on with it)")

    def stop(self, *, release: bool = False) -> None:
        """Stop renewing; `release` also lets go of the lease at once (a paused session waits for no process)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.timing.heartbeat_s + 5)
        if release:
            with contextlib.suppress(Exception):
                self.log.release_lease(self.session_id, self.owner)


@contextlib.contextmanager
def holding_lease(log: SessionLog, session_id: str, timing: LeaseTiming) -> Iterator[Heartbeat]:
    """Renew the session's lease while the block runs. A session still running when the block ends (paused for an
    answer) is released, so its answer can be given from any process at once."""
    beat = Heartbeat(log, session_id, timing).start()
    try:
        yield beat
    finally:
        beat.stop(release=True)


def lease_refusal(lease: SessionLease, now: datetime | None = None) -> str | None:
    """Why a session cannot be resumed now because a process still holds it, or None when none does."""
    now = now or datetime.now(UTC)
    if not lease.live(now):
        return None
    age = lease.heartbeat_age_s(now)
    seen = "no heartbeat yet" if age is None else f"last heartbeat {age:.0f} s ago"
    return (f"session {lease.session_id} is running in another process ({seen}): wait for it to finish, or, if that "
            f"process has been stopped, resume it after its lease expires in {lease.expires_in_s(now):.0f} s")


def sweep_leases(log: SessionLog, say: Callable[[str], None] = lambda _m: None) -> LeaseSweep:
    """The crash sweep every process start and the scheduler's sweep job run: sessions whose process is gone become
    interrupted (checkpointed: `rubricem resume` goes on with them) or failed (never trained on). A store error is
    logged, never fatal: the sweep runs again at the next start."""
    try:
        found = log.sweep_expired_leases()
    except Exception as exc:  # noqa: BLE001 - a sweep must never keep the process from starting
        _log.warning("crash sweep failed: %s", exc)
        return LeaseSweep((), ())
    if found.failed:
        say(f"{len(found.failed)} session(s) whose process stopped could not be resumed: marked failed")
    if found.interrupted:
        say(f"{len(found.interrupted)} session(s) were interrupted (their process stopped): resume one with "
            "`rubricem resume SESSION`")
    return found


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
