"""Approve: pause after the plan until the user accepts, edits or rejects it (LangGraph `interrupt`).

Only reached when the run asked for approval (`AgentDeps.approve_plan`); the node runs again from its start when
the session resumes, and `interrupt` then returns the user's answer instead of pausing.
"""

from __future__ import annotations

from typing import Literal

from langgraph.graph import END
from langgraph.runtime import Runtime
from langgraph.types import Command, interrupt

from agent.approval import PlanDecision, PlanForApproval, approved_plan_text
from agent.deps import AgentDeps
from agent.sequence import SequenceWriter
from agent.state import ResearchState


async def approve(state: ResearchState, runtime: Runtime[AgentDeps]) -> Command[Literal["research", "__end__"]]:
    """Pause with the plan; on an edit, insert the user's plan as a forced span; on a reject, end the run."""
    deps = runtime.context
    plan = PlanForApproval.from_turns(state.get("turns", []))
    answer = interrupt(plan.to_dict())
    decision = PlanDecision.parse(answer)  # already checked by the caller before resuming
    update: dict[str, object] = {"approval": decision.to_dict()}
    if decision.action == "reject":
        return Command(goto=END, update=update)
    if decision.action == "edit":
        w = SequenceWriter(deps, state["prompt"], state.get("turns", []))
        await w.insert("plan", approved_plan_text(decision))
        update["turns"] = w.new
    deps.recorder.event("plan_approved", {"action": decision.action})
    return Command(goto="research", update=update)
