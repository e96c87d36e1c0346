"""Sessions, their turns and tool calls: creating, appending, flagging, finishing, crash recovery and reading back."""

from __future__ import annotations

import json
import math
import os
import socket
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Literal, get_args

from store.errors import ConnectionLost, DuplicateSession, InvalidInput, SessionNotFound
from store.records import (
    STAGES,
    UNLEARNED_SOURCES,
    PromptRecord,
    SessionRecord,
    SessionSource,
    SessionStatus,
    Snippet,
    ToolCallRecord,
    Trajectory,
    Turn,
    TurnKind,
)
from store.session_log.codec import (
    FINISH_REASONS,
    TOKEN_SOURCES,
    choice_in,
    iso,
    json_in,
    label_in,
    mapping_in,
    opt_text_in,
    opt_text_out,
    pack_floats,
    pack_ids,
    text_in,
    text_out,
    unpack_floats,
    unpack_ids,
)
from store.owner import current_actor
from store.session_log.connection import SessionLogBase

_STATUSES: tuple[str, ...] = get_args(SessionStatus)
_SESSION_SOURCES: tuple[str, ...] = get_args(SessionSource)
_KINDS: tuple[str, ...] = get_args(TurnKind)

_STALE_ERROR = "marked failed by crash recovery: still 'running' with no write for longer than {older_than}"
_SWEPT_ERROR = ("interrupted: the process running this session stopped (last heartbeat {heartbeat}) and the session "
                "was not checkpointed, so it cannot be resumed")

DEFAULT_LEASE_S = 90.0


class _Owners(Enum):
    TEAM = "the owner's team"


OWNERS_TEAM = _Owners.TEAM  # `create_session`'s default team: the owner's, read in the insert's transaction
"""How long a session's lease lasts from its creation until the running process's first heartbeat (the service then
renews it with the deployment's `sessions.lease_s`)."""

_OWNER: tuple[int, str] | None = None


def process_lease_owner() -> str:
    """This process's name on the leases it holds (host, pid and a random part, so a reused pid is another owner)."""
    global _OWNER
    if _OWNER is None or _OWNER[0] != os.getpid():  # a forked child is another process
        _OWNER = (os.getpid(), f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}")
    return _OWNER[1]


@dataclass(frozen=True, slots=True)
class SessionLease:
    """Who runs a session and until when: renewed by the running process's heartbeat; past `lease_until` the
    process is taken to be gone."""

    session_id: str
    status: SessionStatus
    heartbeat_at: str | None
    lease_until: str | None
    owner: str | None

    def live(self, now: datetime) -> bool:
        """Whether a process still holds the session (only a running session can be held)."""
        return self.status == "running" and self.lease_until is not None and self.lease_until > iso(now)

    def heartbeat_age_s(self, now: datetime) -> float | None:
        """Seconds since the last heartbeat, or None when there was none."""
        if self.heartbeat_at is None:
            return None
        return max(0.0, (now - datetime.fromisoformat(self.heartbeat_at)).total_seconds())

    def expires_in_s(self, now: datetime) -> float:
        """Seconds until the lease expires (0 when it has)."""
        if self.lease_until is None:
            return 0.0
        return max(0.0, (datetime.fromisoformat(self.lease_until) - now).total_seconds())


@dataclass(frozen=True, slots=True)
class LeaseSweep:
    """What one crash sweep found: running sessions whose process is gone."""

    failed: tuple[str, ...]  # not checkpointed (or their run had ended): marked failed, never trained on
    interrupted: tuple[str, ...]  # checkpointed: left running and shown as interrupted, for `rubricem resume`


@dataclass(frozen=True, slots=True)
class SessionSummary:
    """One row of `list_sessions`: enough for a listing, without turns or token data."""

    session_id: str
    question: str
    status: SessionStatus
    created_at: str
    finished_at: str | None
    policy_version: str
    n_turns: int
    n_tool_calls: int
    malformed: bool
    error: str | None
    source: SessionSource = "api"
    owner: str = "local"
    interrupted: bool = False  # running, not paused, and its lease has expired: the process running it is gone

    @property
    def shown_status(self) -> str:
        """The status to show people: "interrupted" for a running session whose process is gone, else `status`."""
        return "interrupted" if self.interrupted else self.status


@dataclass(frozen=True, slots=True)
class _TurnRow:
    stage: str
    kind: str
    text: str | bytes
    token_ids: bytes
    logprobs: bytes
    policy_version: str
    prompt_sha: str
    token_source: str
    finish_reason: str | None
    prompt_tokens: int | None


def _turn_row(turn: object) -> _TurnRow:
    if not isinstance(turn, Turn):
        raise InvalidInput(f"expected a Turn, got {type(turn).__name__}")
    ids = pack_ids(turn.token_ids, "turn")
    logprobs = pack_floats(turn.logprobs, "turn")
    # Turn checks alignment in __post_init__, but a store must not trust that the caller did not bypass it.
    if logprobs and len(logprobs) // 8 != len(ids) // 4:
        raise InvalidInput("turn: logprobs must be empty or one per token id")
    prompt_tokens = turn.prompt_tokens
    if prompt_tokens is not None and (isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int)
                                      or not 0 <= prompt_tokens < 2**31 or turn.kind != "sampled"):
        raise InvalidInput(f"turn.prompt_tokens must be None or an int >= 0 of a sampled turn, "
                           f"got {prompt_tokens!r:.80}")
    return _TurnRow(
        stage=choice_in(turn.stage, STAGES, "turn.stage"),
        kind=choice_in(turn.kind, _KINDS, "turn.kind"),
        text=text_in(turn.text, "turn.text"),
        token_ids=ids,
        logprobs=logprobs,
        policy_version=label_in(turn.policy_version, "turn.policy_version"),
        prompt_sha=label_in(turn.prompt_sha, "turn.prompt_sha", allow_empty=True),
        token_source=choice_in(turn.token_source, TOKEN_SOURCES, "turn.token_source"),
        finish_reason=None if turn.finish_reason is None else choice_in(
            turn.finish_reason, FINISH_REASONS, "turn.finish_reason"),
        prompt_tokens=prompt_tokens,
    )


@dataclass(frozen=True, slots=True)
class _CallRow:
    tool: str | bytes
    query: str | bytes
    attrs_json: str
    error: str | bytes | None
    seconds: float
    snippets: tuple[tuple[str | bytes, str | bytes, str | bytes, str | bytes, str | bytes], ...]


def _call_row(call: object) -> _CallRow:
    if not isinstance(call, ToolCallRecord):
        raise InvalidInput(f"expected a ToolCallRecord, got {type(call).__name__}")
    if not isinstance(call.attrs, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in call.attrs.items()
    ):
        raise InvalidInput("tool call attrs must map str to str")
    try:
        seconds = float(call.seconds)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"tool call seconds must be a number: {exc}") from exc
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidInput(f"tool call seconds must be finite and >= 0, got {seconds}")
    snippets = []
    for snippet in call.snippets:
        if not isinstance(snippet, Snippet):
            raise InvalidInput(f"expected a Snippet, got {type(snippet).__name__}")
        snippets.append((
            text_in(snippet.id, "snippet.id"), text_in(snippet.tool, "snippet.tool"),
            text_in(snippet.title, "snippet.title"), text_in(snippet.text, "snippet.text"),
            text_in(snippet.url, "snippet.url"),
        ))
    return _CallRow(
        tool=text_in(call.tool, "tool call tool"),
        query=text_in(call.query, "tool call query"),
        attrs_json=json_in(dict(call.attrs), "tool call attrs"),
        error=opt_text_in(call.error, "tool call error"),
        seconds=seconds,
        snippets=tuple(snippets),
    )


class SessionsMixin(SessionLogBase):
    """Sessions with their turns and tool calls: writes that commit one at a time, and reads of whole records."""

    # -- writes --

    def create_session(
        self,
        question: str,
        prompt: PromptRecord,
        options: Mapping[str, object],
        policy_version: str,
        session_id: str | None = None,
        source: SessionSource = "api",
        owner: str | None = None,
        policy_model: str | None = None,
        team: str | None | _Owners = OWNERS_TEAM,
        serving: Mapping[str, object] | None = None,
    ) -> str:
        """Start a session with status "running".

        Args:
            question: The user's question, verbatim.
            prompt: The rendered prompt the assistant sequence continues.
            options: The run options as JSON-serialisable data, e.g. `RunOptions.model_dump(mode="json")`; never
                secrets. Read back as plain JSON (tuples become lists).
            policy_version: The adapter serving this run, e.g. "policy@17".
            session_id: The id to use; a uuid4 hex is generated when None.
            source: Where the session comes from (`store.records.SessionSource`). Sources in `UNLEARNED_SOURCES`
                (benchmark runs, gate probes) start with the training opt-out set.
            owner: Whose session it is; None takes the current actor (`store.owner.acting_as`, else "local"),
                whose per-session learning choice then sets the training opt-out too.
            policy_model: The served model's name, which the price table prices ("embedded" for the in-process
                policy); None when unknown (its cost is then unknown under a non-empty price table).
            team: The team whose policy serves it (issue 49); by default the owner's team, read in this insert's
                transaction. A caller that chose the serving version from the team it read passes that team, so the
                session is recorded (and later trained) with the team that served it. Whether that team shares
                its sessions with the global policy is read in the same transaction and kept with the session
                (migration 0014): opting in later never shares what was asked before.
            serving: Which version serves it and why (`app.service.SessionServing.record`), kept from the start so
                a session that fails or is cut off still says so; merged into `metrics` as "serving" on read when
                the finished session's own metrics do not carry it.

        Returns:
            The session id.

        Raises:
            InvalidInput: A value cannot be stored (nothing was written).
            DuplicateSession: `session_id` is already taken.
        """
        sid = uuid.uuid4().hex if session_id is None else label_in(session_id, "session_id")
        actor = current_actor()
        who = label_in(actor.owner if owner is None else owner, "owner")
        opt_out = source in UNLEARNED_SOURCES or (owner is None and not actor.learn)
        if not isinstance(prompt, PromptRecord):
            raise InvalidInput(f"prompt must be a PromptRecord, got {type(prompt).__name__}")
        values = (
            sid, text_in(question, "question"), label_in(policy_version, "policy_version"),
            mapping_in(options, "options"), text_in(prompt.text, "prompt.text"),
            pack_ids(prompt.token_ids, "prompt"), label_in(prompt.prompt_sha, "prompt.prompt_sha", allow_empty=True),
            choice_in(source, _SESSION_SOURCES, "source"), int(opt_out), who,
            None if policy_model is None else label_in(policy_model, "policy_model"),
            None if serving is None else mapping_in(serving, "serving"),
        )
        # The owner's team as the session starts (issue 49), read in this transaction; it never changes.
        team_sql = "(SELECT u.team FROM users u WHERE u.user_id = ?)" if team is OWNERS_TEAM else "?"
        team_arg = who if team is OWNERS_TEAM else team
        now_dt = self._clock()
        now, until = iso(now_dt), iso(now_dt + timedelta(seconds=DEFAULT_LEASE_S))
        with self._transaction("IMMEDIATE") as conn:
            if conn.execute("SELECT 1 FROM sessions WHERE session_id = ?", (sid,)).fetchone():
                raise DuplicateSession(sid)
            # The creating process holds the session's lease from the start (see `renew_lease`).
            conn.execute(
                "INSERT INTO sessions (session_id, question, policy_version, options_json, prompt_text, "
                "prompt_token_ids, prompt_sha, source, training_opt_out, owner, policy_model, serving_json, status, "
                "created_at, updated_at, heartbeat_at, lease_until, lease_owner, team, share_global) "
                f"VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'running', ?, ?, ?, ?, ?, {team_sql}, "
                # whether that team shares with the global policy, as the session starts (issue 65)
                f"(SELECT t.share_global FROM teams t WHERE t.name = {team_sql}))",
                (*values, now, now, now, until, process_lease_owner(), team_arg, team_arg),
            )
        return sid

    def append_turn(self, session_id: str, turn: Turn) -> int:
        """Append the next turn of a running session and commit it at once.

        Args:
            session_id: A running session.
            turn: The turn, exactly as produced.

        Returns:
            The turn's 0-based index in the assistant sequence.

        Raises:
            InvalidInput: The turn cannot be stored (nothing was written).
            SessionNotFound: Unknown id.
            SessionNotRunning: The session already finished.
        """
        row = _turn_row(turn)  # validate and encode before taking the lock
        now = self._now()
        try:
            return self._append_turn(session_id, row, now, retry=False)
        except ConnectionLost:
            # A lost connection rolled the transaction back, or broke after COMMIT reached the server: the retry, on
            # a fresh connection, first looks for this very turn (same time and content) so it is never doubled.
            # A second failure propagates and the run fails (its session is marked failed where the store allows).
            return self._append_turn(session_id, row, now, retry=True)

    def _append_turn(self, session_id: str, row: _TurnRow, now: str, *, retry: bool) -> int:
        with self._transaction("IMMEDIATE") as conn:
            if retry:
                last = conn.execute(
                    "SELECT idx, created_at, text, token_ids FROM turns WHERE session_id = ? ORDER BY idx DESC LIMIT 1",
                    (session_id,)).fetchone()
                if last is not None and last[1] == now and last[2] == row.text and bytes(last[3]) == bytes(
                        row.token_ids):
                    return int(last[0])
            self._require_running(conn, session_id, "append a turn")
            idx = int(conn.execute(
                "SELECT COALESCE(MAX(idx) + 1, 0) FROM turns WHERE session_id = ?", (session_id,)
            ).fetchone()[0])
            conn.execute(
                "INSERT INTO turns (session_id, idx, stage, kind, text, token_ids, logprobs, policy_version, "
                "prompt_sha, token_source, finish_reason, prompt_tokens, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (session_id, idx, row.stage, row.kind, row.text, row.token_ids, row.logprobs, row.policy_version,
                 row.prompt_sha, row.token_source, row.finish_reason, row.prompt_tokens, now),
            )
            conn.execute("UPDATE sessions SET updated_at = ? WHERE session_id = ?", (now, session_id))
        return idx

    def append_tool_call(self, session_id: str, call: ToolCallRecord) -> int:
        """Record an executed (or refused) tool call with its snippets, committed at once.

        Args:
            session_id: A running session.
            call: The call and what came back.

        Returns:
            The call's 0-based index within the session.

        Raises:
            InvalidInput: The call cannot be stored (nothing was written).
            SessionNotFound: Unknown id.
            SessionNotRunning: The session already finished.
        """
        row = _call_row(call)
        now = self._now()
        with self._transaction("IMMEDIATE") as conn:
            self._require_running(conn, session_id, "append a tool call")
            idx = int(conn.execute(
                "SELECT COALESCE(MAX(idx) + 1, 0) FROM tool_calls WHERE session_id = ?", (session_id,)
            ).fetchone()[0])
            conn.execute(
                "INSERT INTO tool_calls (session_id, idx, tool, query, attrs_json, error, seconds, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (session_id, idx, row.tool, row.query, row.attrs_json, row.error, row.seconds, now),
            )
            conn.executemany(
                "INSERT INTO snippets (session_id, call_idx, position, snippet_id, tool, title, text, url) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(session_id, idx, pos, *snippet) for pos, snippet in enumerate(row.snippets)],
            )
            conn.execute("UPDATE sessions SET updated_at = ? WHERE session_id = ?", (now, session_id))
        return idx

    def set_flags(
        self,
        session_id: str,
        *,
        malformed: bool | None = None,
        max_consecutive_tool_errors: int | None = None,
        injected_bank_items: Sequence[str] | None = None,
    ) -> None:
        """Update trajectory-level flags of a running session; None leaves a flag unchanged.

        Raises:
            InvalidInput: A flag has the wrong type or range (nothing was written).
            SessionNotFound: Unknown id.
            SessionNotRunning: The session already finished.
        """
        updates: dict[str, object] = {}
        if malformed is not None:
            if not isinstance(malformed, bool):
                raise InvalidInput(f"malformed must be a bool, got {malformed!r}")
            updates["malformed"] = int(malformed)
        if max_consecutive_tool_errors is not None:
            n_errors = max_consecutive_tool_errors
            if isinstance(n_errors, bool) or not isinstance(n_errors, int) or n_errors < 0:
                raise InvalidInput(f"max_consecutive_tool_errors must be an int >= 0, got {n_errors!r}")
            updates["max_consecutive_tool_errors"] = n_errors
        if injected_bank_items is not None:
            # A bare str is a Sequence[str] too; storing its characters as ids would be a silent bug.
            if isinstance(injected_bank_items, str) or not all(isinstance(i, str) for i in injected_bank_items):
                raise InvalidInput("injected_bank_items must be a sequence of str ids")
            updates["injected_bank_items_json"] = json_in(list(injected_bank_items), "injected_bank_items")
        now = self._now()
        with self._transaction("IMMEDIATE") as conn:
            self._require_running(conn, session_id, "set flags")
            assignments = ", ".join(f"{column} = ?" for column in updates)  # column names are ours, not input
            conn.execute(
                f"UPDATE sessions SET {assignments + ', ' if assignments else ''}updated_at = ? WHERE session_id = ?",
                (*updates.values(), now, session_id),
            )

    def finish(
        self,
        session_id: str,
        status: Literal["completed", "failed"],
        *,
        report: str | None = None,
        error: str | None = None,
        metrics: Mapping[str, object] | None = None,
    ) -> None:
        """Close a running session as completed or failed; afterwards it is immutable.

        Args:
            session_id: A running session.
            status: "completed" (eligible for judging and training) or "failed" (never trained on).
            report: The final Markdown report.
            error: Why the run failed.
            metrics: JSON-serialisable run metrics (timings, counts).

        Raises:
            InvalidInput: Bad status or values (nothing was written).
            SessionNotFound: Unknown id.
            SessionNotRunning: The session already finished (e.g. finishing twice).
        """
        final = choice_in(status, ("completed", "failed"), "status")
        values = (
            opt_text_in(report, "report"), opt_text_in(error, "error"),
            mapping_in({} if metrics is None else metrics, "metrics"),
        )
        now = self._now()
        with self._transaction("IMMEDIATE") as conn:
            self._require_running(conn, session_id, f"finish as {final}")
            conn.execute(
                "UPDATE sessions SET status = ?, report = ?, error = ?, metrics_json = ?, finished_at = ?, "
                "updated_at = ? WHERE session_id = ?",
                (final, *values, now, now, session_id),
            )

    def mark_stale_running_failed(self, older_than: timedelta) -> int:
        """Crash recovery: fail sessions still "running" whose last write is at least `older_than` ago.

        A process that died mid-run leaves its session running forever; call this at start-up with a margin larger
        than any live run's gap between writes. The turns already written are kept.

        Returns:
            How many sessions were marked failed.
        """
        if not isinstance(older_than, timedelta) or older_than < timedelta(0):
            raise InvalidInput(f"older_than must be a timedelta >= 0, got {older_than!r}")
        now_dt = self._clock()
        now, cutoff = iso(now_dt), iso(now_dt - older_than)
        with self._transaction("IMMEDIATE") as conn:
            cursor = conn.execute(
                "UPDATE sessions SET status = 'failed', finished_at = ?, updated_at = ?, "
                "error = COALESCE(error, ?) WHERE status = 'running' AND updated_at <= ?",
                (now, now, _STALE_ERROR.format(older_than=older_than), cutoff),
            )
            return cursor.rowcount

    # -- leases (migration 0010): which process runs a session --

    def renew_lease(self, session_id: str, lease_s: float, owner: str | None = None) -> bool:
        """The running process's heartbeat: hold the session for `lease_s` more seconds.

        Renews only a lease this owner (default: this process) holds, or one nobody holds any more; a session that
        another process has taken over (`rubricem resume` after this one's lease expired) or that has ended is left
        alone.

        Returns:
            Whether the lease is held by `owner` now.
        """
        if not isinstance(lease_s, int | float) or isinstance(lease_s, bool) or not 0 < lease_s < 1e7:
            raise InvalidInput(f"lease_s must be a number of seconds > 0, got {lease_s!r}")
        who = label_in(owner or process_lease_owner(), "lease owner")
        now_dt = self._clock()
        now, until = iso(now_dt), iso(now_dt + timedelta(seconds=float(lease_s)))
        with self._transaction("IMMEDIATE") as conn:
            cur = conn.execute(
                "UPDATE sessions SET heartbeat_at = ?, lease_until = ?, lease_owner = ? WHERE session_id = ? "
                "AND status = 'running' AND (lease_owner = ? OR lease_owner IS NULL OR lease_until IS NULL "
                "OR lease_until <= ?)",
                (now, until, who, session_id, who, now),
            )
            return cur.rowcount == 1

    def release_lease(self, session_id: str, owner: str | None = None) -> None:
        """Let go of a session this owner holds (a paused session waits for its answer, held by no process)."""
        who = owner or process_lease_owner()
        with self._transaction("IMMEDIATE") as conn:
            conn.execute("UPDATE sessions SET lease_until = ?, lease_owner = NULL WHERE session_id = ? "
                         "AND lease_owner = ?", (self._now(), session_id, who))

    def lease(self, session_id: str) -> SessionLease:
        """The session's lease as stored (`SessionLease.live` says whether a process holds it).

        Raises:
            SessionNotFound: Unknown id.
        """
        with self._transaction("DEFERRED") as conn:
            r = conn.execute("SELECT status, heartbeat_at, lease_until, lease_owner FROM sessions "
                             "WHERE session_id = ?", (session_id,)).fetchone()
        if r is None:
            raise SessionNotFound(session_id)
        return SessionLease(session_id, r[0], r[1], r[2], r[3])

    def sweep_expired_leases(self) -> LeaseSweep:
        """Crash sweep: running sessions whose lease has expired (their process is gone) and that are not paused.

        A checkpointed one (run state 'active') stays running: it is shown as interrupted and `rubricem resume` goes
        on with it; it is never trained on, since only completed sessions are. Any other (not checkpointed, or its
        run already ended) can never go on: it is marked failed, with the last heartbeat in its error. Paused
        sessions (awaiting an answer) hold no lease and are left to their own expiry.
        """
        now = self._now()
        with self._transaction("IMMEDIATE") as conn:
            rows = conn.execute(
                "SELECT s.session_id, s.heartbeat_at, r.state FROM sessions s "
                "LEFT JOIN session_runs r ON r.session_id = s.session_id "
                "WHERE s.status = 'running' AND (s.lease_until IS NULL OR s.lease_until <= ?) "
                "AND (r.state IS NULL OR r.state <> 'awaiting_approval') ORDER BY s.created_at",
                (now,),
            ).fetchall()
            failed, interrupted = [], []
            for sid, heartbeat, state in rows:
                if state == "active":
                    interrupted.append(sid)
                    continue
                conn.execute(
                    "UPDATE sessions SET status = 'failed', finished_at = ?, updated_at = ?, "
                    "error = COALESCE(error, ?), metrics_json = ? WHERE session_id = ? AND status = 'running'",
                    (now, now, _SWEPT_ERROR.format(heartbeat=heartbeat or "never"),
                     json.dumps({"interrupted": "lease_expired"}), sid),
                )
                failed.append(sid)
        return LeaseSweep(tuple(failed), tuple(interrupted))

    # -- reads --

    def get(self, session_id: str) -> SessionRecord:
        """Read a session back with its full trajectory (turns and tool calls in order, token data exact).

        Raises:
            SessionNotFound: Unknown id.
        """
        with self._transaction("DEFERRED") as conn:
            s = conn.execute(
                "SELECT question, status, created_at, finished_at, policy_version, options_json, prompt_text, "
                "prompt_token_ids, prompt_sha, malformed, max_consecutive_tool_errors, injected_bank_items_json, "
                "report, error, metrics_json, source, training_opt_out, owner, policy_model, team, serving_json "
                "FROM sessions WHERE session_id = ?",
                (session_id,),
            ).fetchone()
            if s is None:
                raise SessionNotFound(session_id)
            turn_rows = conn.execute(
                "SELECT stage, kind, text, token_ids, logprobs, policy_version, prompt_sha, token_source, "
                "finish_reason, prompt_tokens FROM turns WHERE session_id = ? ORDER BY idx",
                (session_id,),
            ).fetchall()
            call_rows = conn.execute(
                "SELECT idx, tool, query, attrs_json, error, seconds FROM tool_calls WHERE session_id = ? ORDER BY idx",
                (session_id,),
            ).fetchall()
            snippet_rows = conn.execute(
                "SELECT call_idx, snippet_id, tool, title, text, url FROM snippets WHERE session_id = ? "
                "ORDER BY call_idx, position",
                (session_id,),
            ).fetchall()
        turns = tuple(
            Turn(stage=r[0], kind=r[1], text=text_out(r[2]), token_ids=unpack_ids(r[3]),
                 logprobs=unpack_floats(r[4]), policy_version=r[5], prompt_sha=r[6],
                 token_source=r[7], finish_reason=r[8], prompt_tokens=None if r[9] is None else int(r[9]))
            for r in turn_rows
        )
        by_call: dict[int, list[Snippet]] = {}
        for r in snippet_rows:
            by_call.setdefault(r[0], []).append(Snippet(
                id=text_out(r[1]), tool=text_out(r[2]), title=text_out(r[3]), text=text_out(r[4]),
                url=text_out(r[5])))
        calls = tuple(
            ToolCallRecord(tool=text_out(r[1]), query=text_out(r[2]), attrs=json.loads(r[3]),
                           snippets=tuple(by_call.get(r[0], ())), error=opt_text_out(r[4]), seconds=r[5])
            for r in call_rows
        )
        trajectory = Trajectory(
            session_id=session_id,
            question=text_out(s[0]),
            prompt=PromptRecord(text=text_out(s[6]), token_ids=unpack_ids(s[7]), prompt_sha=s[8]),
            turns=turns,
            tool_calls=calls,
            malformed=bool(s[9]),
            max_consecutive_tool_errors=int(s[10]),
            injected_bank_items=tuple(json.loads(s[11])),
        )
        metrics = json.loads(s[14])
        if s[20] is not None and "serving" not in metrics:  # recorded as it started (migration 0014)
            metrics["serving"] = json.loads(s[20])
        return SessionRecord(
            session_id=session_id, question=trajectory.question, status=s[1], created_at=s[2], finished_at=s[3],
            policy_version=s[4], options=json.loads(s[5]), trajectory=trajectory, report=opt_text_out(s[12]),
            error=opt_text_out(s[13]), metrics=metrics, source=s[15], training_opt_out=bool(s[16]),
            owner=s[17], policy_model=s[18], team=s[19],
        )

    def list_sessions(self, limit: int = 50, status: str | None = None,
                      sources: Collection[str] | None = None, owner: str | None = None) -> list[SessionSummary]:
        """Newest sessions first (by creation), optionally only those with `status`, from one of `sources`, and
        of `owner` (people see only their own through `store.people.ScopedStore`).

        Raises:
            InvalidInput: `limit` < 1, an unknown status or source, or an empty `sources`.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidInput(f"limit must be an int >= 1, got {limit!r}")
        clauses: list[str] = []
        params: list[object] = []
        if status is not None:
            clauses.append("s.status = ?")
            params.append(choice_in(status, _STATUSES, "status"))
        if sources is not None:
            if isinstance(sources, str) or not sources:
                raise InvalidInput(f"sources must be a non-empty collection of sources, got {sources!r:.80}")
            picked = sorted({choice_in(x, _SESSION_SOURCES, "source") for x in sources})
            clauses.append(f"s.source IN ({', '.join('?' * len(picked))})")
            params.extend(picked)
        if owner is not None:
            clauses.append("s.owner = ?")
            params.append(owner)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        with self._transaction("DEFERRED") as conn:
            rows = conn.execute(
                "SELECT s.session_id, s.question, s.status, s.created_at, s.finished_at, s.policy_version, "
                "(SELECT COUNT(*) FROM turns t WHERE t.session_id = s.session_id), "
                "(SELECT COUNT(*) FROM tool_calls c WHERE c.session_id = s.session_id), s.malformed, s.error, "
                "s.source, s.owner, s.lease_until, "
                "(SELECT r.state FROM session_runs r WHERE r.session_id = s.session_id) "
                f"FROM sessions s {where} ORDER BY s.created_at DESC, s.rowid DESC LIMIT ?",
                (*params, limit),
            ).fetchall()
        now = self._now()
        return [
            SessionSummary(session_id=r[0], question=text_out(r[1]), status=r[2], created_at=r[3], finished_at=r[4],
                           policy_version=r[5], n_turns=int(r[6]), n_tool_calls=int(r[7]), malformed=bool(r[8]),
                           error=opt_text_out(r[9]), source=r[10], owner=r[11],
                           interrupted=_interrupted(r[2], r[12], r[13], now))
            for r in rows
        ]

    def interrupted(self, session_id: str) -> bool:
        """Whether a session is running a checkpointed run whose lease has expired (shown as "interrupted", and
        offered for resume).

        Raises:
            SessionNotFound: Unknown id.
        """
        with self._transaction("DEFERRED") as conn:
            r = conn.execute(
                "SELECT s.status, s.lease_until, (SELECT r.state FROM session_runs r WHERE r.session_id = "
                "s.session_id) FROM sessions s WHERE s.session_id = ?", (session_id,)).fetchone()
        if r is None:
            raise SessionNotFound(session_id)
        return _interrupted(r[0], r[1], r[2], self._now())


def _interrupted(status: str, lease_until: str | None, run_state: str | None, now: str) -> bool:
    """Interrupted means resumable: a checkpointed run ('active') whose lease lapsed. A running session without a
    checkpointed run cannot go on; the next crash sweep marks it failed, so it is never offered for resume."""
    return status == "running" and run_state == "active" and (lease_until is None or lease_until <= now)
