"""The graph state. Turns and tool calls accumulate (append reducers); everything else is replaced."""

from __future__ import annotations

import operator
from typing import Annotated, TypedDict

from agent.parse import ParsedCall
from agent.protocols import PromptContext
from store.records import ToolCallRecord, Turn


class ResearchState(TypedDict, total=False):
    """State of one research run."""

    prompt: PromptContext
    question: str  # the user's request as asked (the question-first search's query)
    turns: Annotated[list[Turn], operator.add]
    tool_calls: Annotated[list[ToolCallRecord], operator.add]
    pending_call: ParsedCall | None  # parsed by research, executed by tools
    pending_call_error: str | None  # the research turn ended in </call_tool> but no call could be read
    n_tool_calls: int
    consecutive_tool_errors: int
    max_consecutive_tool_errors: int
    malformed_stages: list[str]
    approve_plan: bool  # durable runs only: whether the plan pauses for approval (read back on resume)
    approval: dict[str, object] | None  # the user's answer to the paused plan (agent.approval.PlanDecision)
    clarify: bool  # durable runs only: whether the clarify node runs before Plan (read back on resume)
    clarify_context: dict[str, object]  # what a clarification needs: the request, the messages and their prompt hash
    clarification: dict[str, object] | None  # the decision and the user's answer (agent.nodes.clarify)
