"""Tools: run the parsed call and append <tool_output> (masked). A failing tool becomes text the model can read."""

from __future__ import annotations

import asyncio
import html
from dataclasses import replace
from typing import Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from agent import telemetry
from agent.deps import AgentDeps
from agent.errors import ToolError
from agent.nodes.research import tool_output_budget
from agent.parse import ParsedCall
from agent.sequence import SequenceWriter
from agent.state import ResearchState
from agent.tools.mcp_client import McpTool
from agent.tools.names import resolve_tool_name
from agent.tools.scope import UrlScoped, approved_url, browse_refusal, seen_urls
from store.records import Snippet, ToolCallRecord

MAX_QUERY_CHARS = 2000


def render_output(snippets: tuple[Snippet, ...] | list[Snippet], error: str | None) -> str:
    """The `<tool_output>` block the model reads (DR Tulu format: `<snippet id=...>` / `<webpage id=...>`)."""
    if error is not None:
        return f"\n<tool_output>\nError: {error}\n</tool_output>\n"
    if not snippets:
        return "\n<tool_output>\nNo results.\n</tool_output>\n"
    parts = []
    for s in snippets:
        tag = "webpage" if s.tool == "browse_webpage" else "snippet"
        title = f"Title: {html.escape(s.title, quote=False)}\n" if s.title else ""
        parts.append(f'<{tag} id="{s.id}">\n{title}{html.escape(s.text, quote=False)}\n</{tag}>')
    return "\n<tool_output>\n" + "\n".join(parts) + "\n</tool_output>\n"


async def _execute(
    call: ParsedCall, deps: AgentDeps, state: ResearchState
) -> tuple[str, tuple[Snippet, ...], str | None]:
    """Run the call inside a tool-call span (issue 36): the resolved tool's name ("unknown" for a name the model made
    up, so the span and metric names stay a fixed set), builtin or mcp, the result count or "tool_error"."""
    name = resolve_tool_name(call.name, deps.tools)
    source = "mcp" if isinstance(deps.tools.get(name or ""), McpTool) else "builtin"
    with telemetry.tool_call(name or "unknown", source=source) as traced:
        tool, snippets, error = await _run(call, name, deps, state, traced)
        if error is not None:
            traced.failed(error)
        else:
            traced.results(len(snippets))
    return tool, snippets, error


async def _run(
    call: ParsedCall, name: str | None, deps: AgentDeps, state: ResearchState, traced: telemetry.ToolCall
) -> tuple[str, tuple[Snippet, ...], str | None]:
    if name is None:  # the parser let through only tool-name characters, so the name is safe to echo
        offered = ", ".join(sorted(deps.tools)) or "none"
        return call.name, (), f"unknown tool {call.name!r} (not offered here); available tools: {offered}"
    if not call.query:
        return name, (), "empty query; put the query between <call_tool ...> and </call_tool>"
    if len(call.query) > MAX_QUERY_CHARS:
        return name, (), f"query too long ({len(call.query)} characters, at most {MAX_QUERY_CHARS})"
    tool = deps.tools[name]
    query = call.query
    if isinstance(tool, UrlScoped) and tool.url_scope == "seen":
        refusal = browse_refusal(query, seen_urls(state.get("question", ""), state.get("tool_calls", [])))
        if refusal is not None:
            return name, (), refusal
        query = approved_url(query) or query  # exactly what was compared: no suffix rides along
    timeout = max(1.0, min(deps.remaining(), 120.0))
    call_id = deps.call_ids()
    traced.call_id(call_id)
    try:
        found = await asyncio.wait_for(tool(query, call.attrs, call_id), timeout=timeout)
    except ToolError as exc:
        return name, (), str(exc) or type(exc).__name__
    except TimeoutError:
        return name, (), f"the tool did not answer within {timeout:.0f} s"
    return name, tuple(found), None


async def fit_output(
    snippets: tuple[Snippet, ...], error: str | None, budget: int, w: SequenceWriter
) -> tuple[tuple[Snippet, ...], str, tuple[int, ...]]:
    """Drop trailing snippets (then shorten the last one) until the rendered block fits `budget` tokens.

    The returned snippets are exactly what the model sees, so citations are checked against them only.
    """
    while True:
        text = render_output(snippets, error)
        ids = await w.tokenize(text)
        if len(ids) <= budget or not snippets:
            return snippets, text, ids
        if len(snippets) > 1:
            snippets = snippets[:-1]
        else:
            last = snippets[0]
            keep = int(len(last.text) * budget / len(ids) * 0.9)
            snippets = (replace(last, text=last.text[:keep].rstrip() + " …"),) if keep > 20 else ()


async def tools(state: ResearchState, runtime: Runtime[AgentDeps]) -> Command[Literal["research"]]:
    """Execute the pending call (or report why it could not be read) and append the tool output."""
    deps = runtime.context
    w = SequenceWriter(deps, state["prompt"], state.get("turns", []))
    call = state.get("pending_call")
    started = deps.clock()
    if call is None:
        record = ToolCallRecord(tool="", query="", error=state.get("pending_call_error") or "no tool call found")
    else:
        deps.recorder.event("search", {"tool": call.name, "query": call.query})
        name, snippets, error = await _execute(call, deps, state)
        record = ToolCallRecord(
            tool=name, query=call.query, attrs=dict(call.attrs), snippets=snippets, error=error,
            seconds=round(deps.clock() - started, 3),
        )
    snippets, text, ids = await fit_output(record.snippets, record.error, tool_output_budget(w, deps), w)
    if len(snippets) < len(record.snippets) or snippets != record.snippets:
        record = replace(record, snippets=snippets)
    w.insert_tokenized("research", text, ids, kind="tool_output")
    deps.recorder.tool_call(record)
    deps.recorder.event("search_done", {"tool": record.tool, "results": len(record.snippets), "error": record.error})
    errors = state.get("consecutive_tool_errors", 0) + 1 if record.error else 0
    return Command(
        goto="research",
        update={
            "turns": w.new,
            "tool_calls": [record],
            "pending_call": None,
            "pending_call_error": None,
            "n_tool_calls": state.get("n_tool_calls", 0) + 1,
            "consecutive_tool_errors": errors,
            "max_consecutive_tool_errors": max(errors, state.get("max_consecutive_tool_errors", 0)),
        },
    )
