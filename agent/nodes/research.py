"""Research: think, evaluate the evidence, then call a tool, or review, or (wrongly) answer."""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from agent.deps import AgentDeps
from agent.parse import CallParseError, ParsedCall, parse_tool_call
from agent.protocols import Generation
from agent.sequence import SequenceWriter
from agent.state import ResearchState

CALL_STOPS = ("</call_tool>", "</call>")
STOPS = (*CALL_STOPS, "</review>", "</answer>")  # vLLM allows at most 4 stop strings
FIRST_CALL_QUERY_TOKENS = 64  # the query the model writes after a forced first-call opening
DEFAULT_TOOL_ORDER = ("local_search", "google_search", "web_search", "snippet_search")
TOOL_OUTPUT_RESERVE = 1024  # tokens kept free for the next tool output
WALL_CLOCK_RESEARCH_SHARE = 0.7  # past this share of the wall-clock budget, stop researching and write


def tool_output_budget(w: SequenceWriter, deps: AgentDeps) -> int:
    """Tokens the next tool output may take: the reserve, or less when review and answer need the room."""
    caps = deps.options.token_caps
    room = deps.options.context_tokens - w.tokens_used() - caps.review - caps.answer
    return max(64, min(TOOL_OUTPUT_RESERVE, room))


def _out_of_room(w: SequenceWriter, deps: AgentDeps) -> str | None:
    caps = deps.options.token_caps
    need = caps.research + TOOL_OUTPUT_RESERVE + caps.review + caps.answer
    if w.tokens_used() + need > deps.options.context_tokens:
        return "context"
    if _past_research_time(deps):
        return "time"
    return None


def _past_research_time(deps: AgentDeps) -> bool:
    """Past this share of the wall clock, the time left belongs to the review and the answer."""
    return deps.elapsed() > WALL_CLOCK_RESEARCH_SHARE * deps.options.wall_clock_s


async def research(state: ResearchState, runtime: Runtime[AgentDeps]) -> Command[Literal["tools", "review", "answer"]]:
    """One research turn; the recorded stage is `review` when the turn itself closes </review>."""
    deps = runtime.context
    w = SequenceWriter(deps, state["prompt"], state.get("turns", []))
    n_calls = state.get("n_tool_calls", 0)
    reason = "budget" if n_calls >= deps.options.max_tool_calls else _out_of_room(w, deps)
    final = reason is not None and _final_turn_fits(w, deps)
    if reason:
        deps.recorder.event("research_stopped", {"reason": reason, "tool_calls": n_calls, "final_turn": final})
        if not final:
            return Command(goto="review")
    if not reason and n_calls == 0 and deps.options.question_first and (tool := default_tool(deps)):
        if query := question_query(state.get("question", "")):
            return await _question_first_call(w, deps, tool, query)
    deps.recorder.event("stage", {"stage": "research", "turn": n_calls + 1, "final": final})
    gen = await w.sample("research", STOPS, deps.options.token_caps.research)
    if gen.stop is None and gen.finish_reason == "stop" and _open_call(gen.text):
        # A server that drops stop strings and could not say which one matched: an open call means </call_tool>.
        gen = replace(gen, stop="</call_tool>")
    if final and (gen.stop in CALL_STOPS or _open_call(gen.text)):  # a call, whole or cut off by the cap
        # No tool runs past the budget: the sample is dropped whole (its tokens stay consistent) and the review
        # node forces <review>.
        deps.recorder.event("dropped", {"stage": "research", "reason": "tool call past the tool budget"})
        return Command(goto="review")
    if not final and gen.stop not in CALL_STOPS and n_calls == 0 and (tool := default_tool(deps)):
        return await _forced_first_call(w, deps, tool)
    if gen.stop in CALL_STOPS:
        await w.keep_closed("research", gen, gen.stop)
        return _to_tools(w, gen.text)
    if gen.stop == "</review>" and "<review>" in gen.text:
        # The model reviewed in this turn (path B): from its last <think> on, this is Stage 3 (METHOD §5.1). The
        # whole turn is recorded as review: it starts right after a tool output, normally with that <think>; a plan
        # update written in the same final turn is counted as review too (spans are decided per turn, not per token).
        deps.recorder.event("stage", {"stage": "review"})  # progress shows the review the model opened itself
        await w.keep_closed("review", gen, "</review>")
        return Command(goto="answer", update={"turns": w.new})
    if gen.stop == "</answer>":
        # An answer without a review: drop it; the review node forces <review> first.
        deps.recorder.event("dropped", {"stage": "research", "reason": "answer before review"})
        return Command(goto="review")
    if gen.finish_reason == "length" and _open_review(gen.text):
        return await _finish_review(w, deps, gen)
    w.keep("research", gen)  # EOS or length: keep what was said, then review
    return Command(goto="review", update={"turns": w.new})


def _final_turn_fits(w: SequenceWriter, deps: AgentDeps) -> bool:
    """After the tool budget (or when the context has no room for another tool output), the model still gets one
    tool-free turn to evaluate its evidence and open its own review, as the distilled trajectories do after their
    last search; a stop for time goes straight to the forced review."""
    if _past_research_time(deps):  # also true when the reason is "time"
        return False
    caps = deps.options.token_caps
    return w.tokens_used() + caps.research + caps.review + caps.answer <= deps.options.context_tokens


def _open_review(text: str) -> bool:
    low = text.lower()
    return low.rfind("<review>") > low.rfind("</review>")


async def _finish_review(w: SequenceWriter, deps: AgentDeps, gen: Generation) -> Command[Literal["answer"]]:
    """The final research turn ran out of the research cap inside its own <review>: the model opened the review
    itself, so it finishes it under the review cap (a distilled final turn, think + evaluation + review, is often
    longer than one research turn). Recorded as review, like path B; a continuation that cannot close the review
    gets a forced closing tag (so the review does not count as self-tagged)."""
    deps.recorder.event("stage", {"stage": "review"})
    w.keep("review", gen)
    rest = await w.sample("review", ("</review>", "</answer>"), deps.options.token_caps.review)
    if rest.stop == "</review>":
        await w.keep_closed("review", rest, "</review>")
    else:
        if rest.stop == "</answer>":  # an answer inside the review: drop it, as the review node does
            deps.recorder.event("dropped", {"stage": "review", "reason": "answer inside the review"})
        else:
            w.keep("review", rest)  # EOS or length again: keep what was said
        await w.insert("review", "</review>")
    return Command(goto="answer", update={"turns": w.new})


def _open_call(text: str) -> bool:
    low = text.lower()
    return low.rfind("<call_tool") > max(low.rfind("</call_tool>"), low.rfind("</tool_output>"))


def default_tool(deps: AgentDeps) -> str | None:
    """The tool a forced first call uses: local documents first, then web search (never browse with a query)."""
    return next((t for t in DEFAULT_TOOL_ORDER if t in deps.tools), None)


async def _forced_first_call(
    w: SequenceWriter, deps: AgentDeps, tool: str
) -> Command[Literal["tools", "review", "answer"]]:
    """Turn 1 must end with </call_tool> ("always search first", METHOD §3.1): drop the sample that did not call a
    tool, force the call's opening tag (masked) and let the model write only the query."""
    deps.recorder.event("dropped", {"stage": "research", "reason": "first turn made no tool call"})
    opening = f'\n<call_tool name="{tool}">'
    await w.insert("research", opening)
    query = await w.sample("research", CALL_STOPS, min(FIRST_CALL_QUERY_TOKENS, deps.options.token_caps.research))
    await w.keep_closed("research", query, "</call_tool>")
    return _to_tools(w, opening + query.text)


def question_query(question: str) -> str:
    """The question-first search's query: the question as asked, on one line. Exactly vanilla RAG's query (its
    question mark kept): the dense half of the hybrid search ranks differently without it (top-5 sets differed on
    16 of the 32 held-out questions), and the same query is what makes this search find what RAG finds."""
    return " ".join(question.split())


async def _question_first_call(
    w: SequenceWriter, deps: AgentDeps, tool: str, query: str
) -> Command[Literal["tools", "review", "answer"]]:
    """The first search is the question itself, issued by the graph (`RunOptions.question_first`).

    Why: one search with the question finds most gold passages of a multi-hop question (vanilla RAG's retrieval);
    a small policy's own first query often finds fewer (issue 20: 0.50-0.56 against 0.67-0.75 of the gold passages).
    With this call the research starts where vanilla RAG ends, and every later query is the model's, written after
    reading those results. The call is inserted text (forced, masked from training) in the same shape the distilled
    trajectories open their research with (`evidence-chain/5`), so the student reads what it was trained on. The
    eval's compliance figures do not count it as the model's tool call nor against its research tags."""
    deps.recorder.event("stage", {"stage": "research", "turn": 1, "final": False})
    text = f'\n<call_tool name="{tool}">{query}</call_tool>'
    await w.insert("research", text)
    # The call is built, not parsed back from the text: a question that itself contains markup stays one query.
    return Command(goto="tools", update={"turns": w.new, "pending_call": ParsedCall(tool, query, {}),
                                         "pending_call_error": None})


def _to_tools(w: SequenceWriter, text: str) -> Command[Literal["tools", "review", "answer"]]:
    try:
        call, error = parse_tool_call(text), None
    except CallParseError as exc:
        call, error = None, str(exc)
    return Command(goto="tools", update={"turns": w.new, "pending_call": call, "pending_call_error": error})
