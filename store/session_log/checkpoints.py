"""Durable sessions and plan approval in the session log (migration 0009, issue 21).

The checkpoints themselves live in LangGraph's checkpointer (`agent.checkpoint`); this module keeps, beside each
session, which thread holds them and where the run stands (`RunState`), what the user decided about a paused plan
(`PlanApproval`), and the one repair a resume needs: dropping the turns and tool calls a killed process wrote after
its last checkpoint, so that every turn is in the log exactly once.

The sessions table keeps its three statuses: a paused or cut-off session is still 'running'; a rejected, expired
or unresumable one ends 'failed' (never trained on), and `RunState.state` says why.

A session paused BEFORE its plan for a clarifying question uses the same 'awaiting_approval' state (no migration):
its pause says `{"kind": "clarification", "question": ...}` (`RunState.pause_kind`). The answer joins the session's
prompt (`set_prompt`, before any turn exists) and the decision is kept in the session's metrics (`clarification`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from datetime import UTC, datetime, timedelta

from store.errors import InvalidInput, SessionNotFound
from store.records import PromptRecord, Turn
from store.session_log import DEFAULT_LEASE_S, SessionLog, process_lease_owner
from store.session_log.codec import (
    choice_in,
    iso,
    json_in,
    label_in,
    opt_text_in,
    pack_ids,
    text_in,
    text_out,
    unpack_ids,
)

RunStateName = Literal["active", "awaiting_approval", "finished", "rejected", "expired", "interrupted"]
ApprovalAction = Literal["accept", "edit", "reject"]
_STATES: tuple[str, ...] = get_args(RunStateName)
_ACTIONS: tuple[str, ...] = get_args(ApprovalAction)


@dataclass(frozen=True, slots=True)
class RunState:
    """Where a durable session stands."""

    session_id: str
    thread_id: str
    state: RunStateName
    reason: str | None
    pause: dict[str, Any] | None  # what the paused plan shows the user (agent.nodes.approve.PlanForApproval)
    expires_at: str | None
    updated_at: str

    @property
    def pause_kind(self) -> Literal["plan", "clarification"] | None:
        """What a paused session waits for: its plan's approval, or the answer to a clarifying question."""
        if self.state != "awaiting_approval":
            return None
        return "clarification" if (self.pause or {}).get("kind") == "clarification" else "plan"

    def expired(self, now: datetime | None = None) -> bool:
        """Whether a pause's expiry time has passed (never for a session that is not paused)."""
        if self.state != "awaiting_approval" or not self.expires_at:
            return False
        return datetime.fromisoformat(self.expires_at) <= (now or datetime.now(UTC))


@dataclass(frozen=True, slots=True)
class PlanApproval:
    """The user's decision on a plan, with the policy's own plan kept beside the approved one."""

    session_id: str
    action: ApprovalAction
    owner: str
    policy_plan: str
    approved: dict[str, Any] = field(default_factory=dict)  # {"rubric": [...], "note": "...", "text": "..."}
    created_at: str = ""

    @property
    def user_rubrics(self) -> tuple[str, ...]:
        """The approved rubric items (they go to the judge for this session)."""
        return tuple(str(r) for r in self.approved.get("rubric", ()))


class SessionRuns:
    """Run states and plan approvals over a SessionLog's database."""

    def __init__(self, log: SessionLog) -> None:
        self.log = log

    # -- run states --

    def start(self, session_id: str, thread_id: str) -> None:
        """Record that a session runs durably on `thread_id` (state 'active')."""
        now = self.log.now()
        with self.log.transaction(write=True) as conn:
            if conn.execute("SELECT 1 FROM sessions WHERE session_id = ?", (session_id,)).fetchone() is None:
                raise SessionNotFound(session_id)
            conn.execute("DELETE FROM session_runs WHERE session_id = ?", (session_id,))
            conn.execute(
                "INSERT INTO session_runs (session_id, thread_id, state, updated_at) VALUES (?, ?, 'active', ?)",
                (session_id, label_in(thread_id, "thread_id"), now),
            )

    def set_state(
        self,
        session_id: str,
        state: RunStateName,
        *,
        reason: str | None = None,
        pause: Mapping[str, Any] | None = None,
        expires_at: str | None = None,
    ) -> None:
        """Move a durable session to `state` (pause and expiry only mean something while awaiting approval). A
        paused session waits for its answer, not for a process: its lease is released (migration 0010), so the
        answer may be given from any process at once."""
        values = (choice_in(state, _STATES, "state"), opt_text_in(reason, "reason"),
                  None if pause is None else json_in(dict(pause), "pause"), opt_text_in(expires_at, "expires_at"))
        now = self.log.now()
        with self.log.transaction(write=True) as conn:
            cur = conn.execute(
                "UPDATE session_runs SET state = ?, reason = ?, pause_json = ?, expires_at = ?, updated_at = ? "
                "WHERE session_id = ?",
                (*values, now, session_id),
            )
            if cur.rowcount == 0:
                raise SessionNotFound(session_id)
            if state == "awaiting_approval":
                conn.execute("UPDATE sessions SET lease_until = ?, lease_owner = NULL WHERE session_id = ?",
                             (now, session_id))

    def get(self, session_id: str) -> RunState | None:
        """The session's run state, or None for a session that never ran durably."""
        with self.log.transaction(write=False) as conn:
            r = conn.execute(
                "SELECT thread_id, state, reason, pause_json, expires_at, updated_at FROM session_runs "
                "WHERE session_id = ?", (session_id,),
            ).fetchone()
        if r is None:
            return None
        return RunState(session_id, r[0], r[1], opt_text(r[2]), None if r[3] is None else json.loads(r[3]), r[4], r[5])

    def waiting(self, *, include_expired: bool = False) -> list[RunState]:
        """Sessions paused for plan approval or a clarification answer, oldest first; a pause past its expiry is
        left out (it can no longer be answered) unless `include_expired`."""
        with self.log.transaction(write=False) as conn:
            rows = conn.execute(
                "SELECT session_id FROM session_runs WHERE state = 'awaiting_approval' ORDER BY updated_at"
            ).fetchall()
        runs = [s for s in (self.get(r[0]) for r in rows) if s is not None]
        return runs if include_expired else [s for s in runs if not s.expired()]

    def claim(self, seen: RunState, *, lease_s: float = DEFAULT_LEASE_S, owner: str | None = None) -> bool:
        """Take a session over for one resume: move it to 'active' (pause and expiry cleared) and take its lease
        for `lease_s` seconds (for `owner`, default this process), only if its row is still exactly as `seen`
        (same state, same `updated_at`) and no process holds its lease (migration 0010). Of two resumers that read
        the same row, one wins; a session another process is still running is never taken; the loser gets False
        and must not go on."""
        now_dt = self.log.clock()
        now = iso(now_dt)
        while now == seen.updated_at:  # the new version must differ from the one read (same-microsecond clock)
            now_dt = self.log.clock()
            now = iso(now_dt)
        until = iso(now_dt + timedelta(seconds=lease_s))
        with self.log.transaction(write=True) as conn:
            held = conn.execute(
                "SELECT 1 FROM sessions WHERE session_id = ? AND status = 'running' AND lease_until IS NOT NULL "
                "AND lease_until > ?", (seen.session_id, now)).fetchone()
            if held is not None:
                return False
            cur = conn.execute(
                "UPDATE session_runs SET state = 'active', reason = NULL, pause_json = NULL, expires_at = NULL, "
                "updated_at = ? WHERE session_id = ? AND state = ? AND updated_at = ?",
                (now, seen.session_id, seen.state, seen.updated_at),
            )
            if cur.rowcount != 1:
                return False
            conn.execute("UPDATE sessions SET heartbeat_at = ?, lease_until = ?, lease_owner = ? WHERE session_id = ?",
                         (now, until, owner or process_lease_owner(), seen.session_id))
            return True

    def set_prompt(self, session_id: str, prompt: PromptRecord) -> None:
        """Replace the prompt of a running session that has no turn yet (a clarification answer joined its user
        message before the plan).

        Raises:
            InvalidInput: the session has finished or already holds turns (nothing changed).
            SessionNotFound: unknown id.
        """
        values = (text_in(prompt.text, "prompt.text"), pack_ids(prompt.token_ids, "prompt"),
                  label_in(prompt.prompt_sha, "prompt.prompt_sha", allow_empty=True))
        with self.log.transaction(write=True) as conn:
            row = conn.execute("SELECT status FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
            if row is None:
                raise SessionNotFound(session_id)
            if row[0] != "running":
                raise InvalidInput(f"session {session_id} is {row[0]}: its prompt can no longer change")
            if conn.execute("SELECT 1 FROM turns WHERE session_id = ? LIMIT 1", (session_id,)).fetchone():
                raise InvalidInput(f"session {session_id} already has turns: its prompt can no longer change")
            conn.execute(
                "UPDATE sessions SET prompt_text = ?, prompt_token_ids = ?, prompt_sha = ?, updated_at = ? "
                "WHERE session_id = ?", (*values, self.log.now(), session_id),
            )

    # -- the repair a resume needs --

    def truncate(self, session_id: str, turns: Sequence[Turn], n_tool_calls: int) -> int:
        """Keep exactly the checkpoint's turns and tool calls in the log of a running session.

        A killed process may have written turns (and a tool call) after its last checkpoint; the resumed run makes
        them again. Checks that the log's first turns are the checkpoint's (same stage, kind and token ids).

        Returns:
            How many turns were dropped.

        Raises:
            InvalidInput: the log holds fewer turns than the checkpoint, or different ones (nothing changed).
        """
        with self.log.transaction(write=True) as conn:
            rows = conn.execute(
                "SELECT idx, stage, kind, token_ids FROM turns WHERE session_id = ? ORDER BY idx", (session_id,)
            ).fetchall()
            if len(rows) < len(turns):
                raise InvalidInput(f"the log holds {len(rows)} turns, the checkpoint {len(turns)}")
            for row, turn in zip(rows, turns, strict=False):
                if (row[1], row[2], unpack_ids(row[3])) != (turn.stage, turn.kind, tuple(turn.token_ids)):
                    raise InvalidInput(f"turn {row[0]} in the log differs from the checkpoint's")
            conn.execute("DELETE FROM turns WHERE session_id = ? AND idx >= ?", (session_id, len(turns)))
            conn.execute("DELETE FROM snippets WHERE session_id = ? AND call_idx >= ?", (session_id, n_tool_calls))
            conn.execute("DELETE FROM tool_calls WHERE session_id = ? AND idx >= ?", (session_id, n_tool_calls))
            conn.execute("UPDATE sessions SET updated_at = ? WHERE session_id = ?", (self.log.now(), session_id))
        return len(rows) - len(turns)

    # -- plan approvals --

    def record_approval(self, approval: PlanApproval) -> None:
        """Store the user's decision on a session's plan (one per session; a later one replaces it)."""
        values = (
            label_in(approval.session_id, "session_id"), choice_in(approval.action, _ACTIONS, "action"),
            text_in(approval.owner or "local", "owner"), text_in(approval.policy_plan, "policy_plan"),
            json_in(dict(approval.approved), "approved"),
        )
        with self.log.transaction(write=True) as conn:
            conn.execute("DELETE FROM plan_approvals WHERE session_id = ?", (approval.session_id,))
            conn.execute(
                "INSERT INTO plan_approvals (session_id, action, owner, policy_plan, approved_json, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?)", (*values, self.log.now()),
            )

    def approval(self, session_id: str) -> PlanApproval | None:
        """The decision on a session's plan, if any."""
        with self.log.transaction(write=False) as conn:
            r = conn.execute(
                "SELECT action, owner, policy_plan, approved_json, created_at FROM plan_approvals "
                "WHERE session_id = ?", (session_id,),
            ).fetchone()
        if r is None:
            return None
        return PlanApproval(session_id, r[0], text_out(r[1]), text_out(r[2]), json.loads(r[3]), r[4])

    def edited_plans(self, limit: int | None = None) -> list[PlanApproval]:
        """Plans the user edited, oldest first: (policy plan, approved plan) pairs for export."""
        with self.log.transaction(write=False) as conn:
            rows = conn.execute(
                "SELECT session_id FROM plan_approvals WHERE action = 'edit' ORDER BY created_at, session_id"
            ).fetchall()
        picked = [r[0] for r in rows][: limit if limit is not None else None]
        return [a for a in (self.approval(s) for s in picked) if a is not None]


def opt_text(value: object) -> str | None:
    """A nullable text column read back."""
    return None if value is None else text_out(value)  # type: ignore[arg-type]
