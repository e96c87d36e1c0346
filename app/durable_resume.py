"""Checks and repairs before a session goes on from its checkpoint (`ResearchService.resume`).

Bad input changes nothing: an unknown session (SessionNotFound), a finished one, one never run durably, an answer
to a session that is not waiting for one (or waits for the other kind of answer), a session another resume has
just taken over, or one another process is still running (its lease is live, issue 34) (ResumeError). A session
that cannot go on (its checkpoint missing, unreadable, or not matching the log; its pause expired) is marked failed,
and its run state says why.
"""

from __future__ import annotations

from typing import Any, Protocol

from agent.approval import PlanDecision, PlanForApproval
from agent.checkpoint import open_checkpointer
from agent.clarify import ClarificationAnswer
from agent.config import RunOptions
from agent.deps import AgentDeps
from agent.graph import build_graph
from agent.protocols import PolicyClient, SearchTool
from agent.tools.ids import CallIdFactory
from app.durable import DurableSessions, LeaseTiming, ResumeError, lease_refusal, mark_expired, prune_ended
from app.outcomes import EventSink, ResearchPaused, RunFailedError
from store.errors import InvalidInput
from store.records import SessionRecord
from store.session_log import SessionLog
from store.session_log.checkpoints import PlanApproval, RunStateName


class ResumableService(Protocol):
    """What the resume checks read of `app.service.ResearchService` (a protocol, so this module never imports it)."""

    log: SessionLog
    durable: DurableSessions | None
    lease: LeaseTiming
    policy: PolicyClient
    tools: dict[str, SearchTool]


async def prepare_resume(
    service: ResumableService, sid: str, decision: PlanDecision | ClarificationAnswer | None, sink: EventSink
) -> ResearchPaused | tuple[SessionRecord, AgentDeps, int]:
    """The pause again (no answer given), or the session's record, fresh deps and the dropped turns; the session
    is then taken over by this resume (`SessionRuns.claim`: a concurrent second resume is refused, and so is a
    session whose lease another live process holds: its turns would be appended twice)."""
    rec = service.log.get(sid)  # SessionNotFound for an unknown id
    durable = service.durable
    if durable is None:
        raise ResumeError("durable sessions are off (RUBRICEM_SESSIONS__CHECKPOINTS=false): nothing to resume")
    if rec.status != "running":
        raise ResumeError(f"session {sid} is {rec.status}: only an unfinished session can be resumed")
    run = durable.runs.get(sid)
    if run is None or run.state not in ("active", "awaiting_approval"):
        why = "was not run with checkpoints" if run is None else f"is {run.state}"
        raise ResumeError(f"session {sid} {why}: it cannot be resumed")
    waiting = run.state == "awaiting_approval"
    asks = run.pause_kind == "clarification"
    if not waiting and decision is not None:
        raise ResumeError(f"session {sid} is not waiting for an answer (plan approval or clarification)")
    if waiting and asks and isinstance(decision, PlanDecision):
        raise ResumeError(f"session {sid} waits for the answer to its clarifying question, not a plan decision")
    if waiting and not asks and isinstance(decision, ClarificationAnswer):
        raise ResumeError(f"session {sid} waits for its plan's approval, not a clarification answer")

    def give_up(state: RunStateName, reason: str) -> RunFailedError:
        service.log.finish(sid, "failed", error=reason, metrics={"interrupted": state})
        durable.runs.set_state(sid, state, reason=reason)
        return RunFailedError(sid, reason)

    if run.expired():
        failure = RunFailedError(sid, mark_expired(service.log, run))
        await prune_ended(durable, run.thread_id)  # the session has ended: its checkpoints go, as on any end
        raise failure
    if waiting and decision is None:
        if asks:
            return ResearchPaused(sid, PlanForApproval.from_dict({}), run.expires_at or "",
                                  question=str((run.pause or {}).get("question", "")))
        return ResearchPaused(sid, PlanForApproval.from_dict(run.pause or {}), run.expires_at or "")
    if (held := lease_refusal(service.log.lease(sid), service.log.clock())) is not None:
        raise ResumeError(held)
    if not durable.runs.claim(run, lease_s=service.lease.lease_s):
        held = lease_refusal(service.log.lease(sid), service.log.clock())
        raise ResumeError(held or f"session {sid} is already being resumed by another request: wait for that run "
                          "(or reload the session) instead of resuming it twice")
    try:
        async with open_checkpointer(durable.target) as cp:
            snapshot = await build_graph(cp).aget_state({"configurable": {"thread_id": run.thread_id}})
        values: dict[str, Any] = dict(snapshot.values or {})
    except Exception as exc:  # noqa: BLE001 - a corrupt checkpoint in any form ends the session, with the reason
        raise give_up("interrupted", f"the checkpoint could not be read ({type(exc).__name__}: {exc})") from exc
    if "prompt" not in values:
        raise give_up("interrupted", f"no checkpoint for session {sid} in {durable.target.location}")
    turns, calls = list(values.get("turns", [])), list(values.get("tool_calls", []))
    try:
        dropped = durable.runs.truncate(sid, turns, len(calls))
    except InvalidInput as exc:
        raise give_up("interrupted", f"the checkpoint does not match the session log ({exc})") from exc
    if isinstance(decision, PlanDecision):
        policy_plan = "".join(t.text for t in turns if t.stage == "plan" and t.kind == "sampled")
        approved = {"rubric": list(decision.rubric), "note": decision.note} if decision.action == "edit" else {}
        durable.runs.record_approval(PlanApproval(sid, decision.action, decision.owner, policy_plan, approved))
    durable.runs.set_state(sid, "active")
    return rec, _deps(service, rec, values, turns, len(calls)), dropped


def _deps(service: ResumableService, rec: SessionRecord, values: dict[str, Any], turns: list[Any],
          n_calls: int) -> AgentDeps:
    """Deps for the rest of the run: the session's own options; a fresh wall-clock budget (the time a process was
    dead or a plan waited is not research time); call ids advanced past the ones already used."""
    options = RunOptions.model_validate(rec.options)
    ids = CallIdFactory(options.seed)
    for _ in range(n_calls):  # a seeded run draws the ids it would have drawn next
        ids()
    deps = AgentDeps(policy=service.policy, tools=service.tools, options=options, call_ids=ids,
                     prompt_sha=rec.trajectory.prompt.prompt_sha, approve_plan=bool(values.get("approve_plan")))
    deps.generate_calls = sum(1 for t in turns if t.kind == "sampled")
    deps.started_at = deps.clock()
    return deps
