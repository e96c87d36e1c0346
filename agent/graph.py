"""The (Clarify →) Plan → Research (loop with tools) → Review → Answer graph. Assembly only; the logic lives in the
nodes. Each node call is one stage span (issue 36), added here rather than in every node."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.errors import GraphBubbleUp
from langgraph.graph import START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from agent import telemetry
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


Node = Callable[..., Awaitable[Any]]


def traced(name: str, node: Node) -> Node:
    """`node` inside a stage span named after it. A pause (LangGraph's interrupt, which is an exception) ends the span
    as paused, not as an error. `functools.wraps` keeps the node's signature and return type for LangGraph."""

    @functools.wraps(node)
    async def run(state: Any, runtime: Any) -> Any:
        paused: GraphBubbleUp | None = None
        with telemetry.stage_span(name) as span:
            try:
                return await node(state, runtime)
            except GraphBubbleUp as exc:  # an interrupt: the node waits for a person
                telemetry.set_attrs(span, {"rubricem.stage.paused": True})
                paused = exc
        assert paused is not None
        raise paused

    return run


def build_graph(checkpointer: BaseCheckpointSaver[str] | None = None) -> CompiledStateGraph:  # type: ignore[type-arg]
    """Compile the research graph; routing is done by each node's Command. With a checkpointer, every step is
    saved on the run's thread (durable sessions, plan approval)."""
    g = StateGraph(ResearchState, context_schema=AgentDeps)
    nodes: list[tuple[str, Node]] = [
        ("clarify", clarify),  # reached only when the run asked for clarification before planning
        ("await_clarification", await_clarification),
        ("plan", plan),
        ("approve", approve),  # reached only when the run asked for plan approval
        ("research", research),
        ("tools", tools),
        ("review", review),
        ("answer", answer),
    ]
    for name, node in nodes:
        g.add_node(name, traced(name, node))
    g.add_conditional_edges(START, _entry, ["clarify", "plan"])
    return g.compile(checkpointer=checkpointer)
