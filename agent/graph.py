"""The (Clarify →) Plan → Research (loop with tools) → Review → Answer graph. Assembly only; the logic lives in the
nodes."""

from __future__ import annotations

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from agent.deps import AgentDeps
from agent.nodes.answer import answer
from agent.nodes.approve import approve
from agent.nodes.clarify import await_clarification, clarify
from agent.nodes.plan import plan
from agent.nodes.research import research
from agent.nodes.review import review
from agent.nodes.tools import tools
from agent.state import ResearchState


def _entry(state: ResearchState) -> str:
    """Clarify first only when the run's input asked for it; otherwise the graph starts at Plan, as before."""
    return "clarify" if state.get("clarify") else "plan"


def build_graph(checkpointer: BaseCheckpointSaver[str] | None = None) -> CompiledStateGraph:  # type: ignore[type-arg]
    """Compile the research graph; routing is done by each node's Command. With a checkpointer, every step is
    saved on the run's thread (durable sessions, plan approval)."""
    g = StateGraph(ResearchState, context_schema=AgentDeps)
    g.add_node("clarify", clarify)  # reached only when the run asked for clarification before planning
    g.add_node("await_clarification", await_clarification)
    g.add_node("plan", plan)
    g.add_node("approve", approve)  # reached only when the run asked for plan approval
    g.add_node("research", research)
    g.add_node("tools", tools)
    g.add_node("review", review)
    g.add_node("answer", answer)
    g.add_conditional_edges(START, _entry, ["clarify", "plan"])
    return g.compile(checkpointer=checkpointer)
