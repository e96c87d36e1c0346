"""Plan approval and clarification in the research chat (issue 21): the per-chat toggle, and the form shown in a
paused session's stage view: accept, edit (rubric items, a note to the research plan) or reject a paused plan; or
answer the clarifying question asked before the plan (an empty answer goes on without clarification). Whether a
question is asked is the deployment's `sessions.clarify` setting.

The pause is a checkpoint, so the form is drawn from the store and works after a restart of the app. An answer
that cannot be applied (an edit that removes every rubric item, ...) is refused with a message and the session
stays paused; a pause past its expiry is never offered: the session is ended there, expired. The chat page only
calls `toggle` and `draw_pending`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import streamlit as st

from agent.approval import ApprovalError, PlanDecision, PlanForApproval
from agent.clarify import ClarificationAnswer, ClarificationError
from app.durable import end_if_expired
from app.service import ResearchPaused, RunFailedError
from app.ui import state
from app.ui.runner import LiveRun, RunLimits, RunRefused
from app.ui.view import RunView, error_reference, md_literal
from store.owner import acting_as
from store.records import SessionRecord
from store.session_log.checkpoints import SessionRuns


def toggle(chat: object) -> bool:
    """The chat's "approve the plan first" switch (on by default; off when the app has no checkpoints)."""
    if state.services().research.durable is None:
        return False
    return bool(st.sidebar.toggle("Approve the plan before research", value=True, key=f"approve_{id(chat)}",
                                  help="The run pauses after its plan: accept it, edit its rubric, or reject it."))


def _owner() -> str:
    """Who answered: the signed-in person (issue 18's viewer), else the local user."""
    viewer = getattr(state, "viewer", None)
    try:
        return str(viewer().user_id) if viewer is not None else "local"
    except Exception:  # noqa: BLE001 - no identity on this page: the local user
        return "local"


def draw_pending(record: SessionRecord, draw_run: Callable[[RunView, bool], None]) -> None:
    """Under a running session that waits for approval: the plan and the form; answering resumes the run here."""
    svc = state.services()
    if record.status != "running" or svc.research.durable is None:
        return
    run = SessionRuns(svc.log).get(record.session_id)
    if run is None or run.state != "awaiting_approval":
        return
    if (reason := end_if_expired(svc.log, svc.research.durable, run)) is not None:
        st.warning(f"This session ended: {md_literal(reason)}.")
        return
    if run.pause_kind == "clarification":
        _draw_question(record, str((run.pause or {}).get("question", "")), run.expires_at, draw_run)
        return
    plan = PlanForApproval.from_dict(run.pause or {})
    sid = record.session_id
    with st.form(f"approve_form_{sid}"):
        st.markdown("**The plan waits for your approval**" + (f" (until {run.expires_at[:16]})" if run.expires_at
                                                                   else ""))
        st.markdown(f"*Deep analysis:* {md_literal(plan.deep_analysis or '(none)')}")
        rubric = st.text_area("Rubric items (one a line: add, remove or reword)", "\n".join(plan.rubric),
                              key=f"approve_rubric_{sid}")
        st.markdown(f"*Research plan:* {md_literal(plan.research_plan or '(none)')}")
        note = st.text_input("A note to the research plan (optional)", key=f"approve_note_{sid}")
        cols = st.columns(3)
        accept = cols[0].form_submit_button("Accept")
        edit = cols[1].form_submit_button("Apply my edit")
        reject = cols[2].form_submit_button("Reject")
    answer: dict[str, Any] | None = None
    if accept:
        answer = {"action": "accept"}
    elif edit:
        answer = {"action": "edit", "rubric": rubric.splitlines(), "note": note}
    elif reject:
        answer = {"action": "reject"}
    if answer is None:
        return
    try:
        decision = PlanDecision.parse(answer | {"owner": _owner()})
    except ApprovalError as exc:
        st.error(f"Not applied: {md_literal(str(exc))}. The plan still waits.")
        return
    _resume(record, decision, draw_run)


def _draw_question(record: SessionRecord, question: str, expires_at: str | None,
                   draw_run: Callable[[RunView, bool], None]) -> None:
    """The clarifying question and a text box; answering (or sending nothing) resumes the run here."""
    sid = record.session_id
    with st.form(f"clarify_form_{sid}"):
        st.markdown("**Before planning, one question**" + (f" (until {expires_at[:16]})" if expires_at else ""))
        st.markdown(md_literal(question))
        text = st.text_area("Your answer (leave empty to go on without clarification)", key=f"clarify_answer_{sid}")
        sent = st.form_submit_button("Send and go on")
    if not sent:
        return
    try:
        answer = ClarificationAnswer.parse({"answer": text, "owner": _owner()})
    except ClarificationError as exc:
        st.error(f"Not applied: {md_literal(str(exc))}. The question still waits.")
        return
    _resume(record, answer, draw_run)


def _resume(record: SessionRecord, decision: PlanDecision | ClarificationAnswer,
            draw_run: Callable[[RunView, bool], None]) -> None:
    view = RunView.from_record(record)
    viewer = state.viewer()  # an answer starts a run: it counts against the caps (issue 34)
    # The run goes on as the person who answered (issue 65), as a question they ask does (chat_page): the research
    # loop's thread would otherwise run it as `local`, the open UI's admin.
    with acting_as(viewer.user_id):
        run = LiveRun(state.services().research, record.question, None,  # type: ignore[arg-type]
                      resume=(record.session_id, decision), limits=RunLimits.from_config(state.settings().sessions),
                      admin=viewer.admin, person=viewer.user_id)
    box, timer, started = st.empty(), st.empty(), time.monotonic()
    for event in run.events():
        timer.caption(f"⏱ {time.monotonic() - started:.0f} s")
        if event is not None:
            view.apply(event)
            with box.container():
                draw_run(view, True)
    ended = run.ended
    assert ended is not None
    if isinstance(ended.error, RunRefused):  # over a cap: nothing started, the message says what to do
        st.error(md_literal(str(ended.error)))
        return
    if ended.error is not None and not isinstance(ended.error, RunFailedError):
        st.error(error_reference("Could not resume the session", ended.error))
        return
    if isinstance(ended.outcome, ResearchPaused):  # after a clarification, the plan may wait for approval next
        st.info("The question still waits." if ended.outcome.question is not None else "The plan waits.")
    st.rerun()
