"""Plan approval in the research chat (issue 21): the per-chat toggle, and the form shown in a paused session's
stage view (accept; edit the rubric items and add a note to the research plan; reject).

The pause is a checkpoint, so the form is drawn from the store and works after a restart of the app. An answer
that cannot be applied (an edit that removes every rubric item, ...) is refused with a message and the session
stays paused. The chat page only calls `toggle` and `draw_pending`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import streamlit as st

from agent.approval import ApprovalError, PlanDecision, PlanForApproval
from app.service import ResearchPaused, RunFailedError
from app.ui import state
from app.ui.runner import LiveRun
from app.ui.view import RunView, md_literal
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
        st.error(f"Not applied: {exc}. The plan still waits.")
        return
    _resume(record, decision, draw_run)


def _resume(record: SessionRecord, decision: PlanDecision, draw_run: Callable[[RunView, bool], None]) -> None:
    view = RunView.from_record(record)
    run = LiveRun(state.services().research, record.question, None, resume=(record.session_id, decision))  # type: ignore[arg-type]
    box, timer, started = st.empty(), st.empty(), time.monotonic()
    for event in run.events():
        timer.caption(f"⏱ {time.monotonic() - started:.0f} s")
        if event is not None:
            view.apply(event)
            with box.container():
                draw_run(view, True)
    ended = run.ended
    assert ended is not None
    if ended.error is not None and not isinstance(ended.error, RunFailedError):
        st.error(f"Could not resume: {type(ended.error).__name__}: {ended.error}")
        return
    if isinstance(ended.outcome, ResearchPaused):  # cannot happen after an answer; shown again if it does
        st.info("The plan still waits.")
    st.rerun()
