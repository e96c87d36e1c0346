"""Running one research session through the graph: validate the question, render the prompt, run, collect."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.types import Command

from agent import bank, prompts
from agent.approval import PlanForApproval
from agent.config import FormatLabel
from agent.deps import AgentDeps
from agent.errors import InputError
from agent.graph import build_graph
from agent.protocols import ChatMessage, PromptContext, SearchTool
from agent.report import Report, build_report
from store.records import PromptRecord, Retrieval, Trajectory


@dataclass(frozen=True, slots=True)
class RunResult:
    """What a finished run produced."""

    trajectory: Trajectory
    report: Report
    clarification: dict[str, Any] | None = None  # what the clarify node decided and the user answered, if it ran


@dataclass(frozen=True, slots=True)
class PausedRun:
    """A durable run that stopped after the plan to wait for the user's approval (its checkpoint holds the rest)."""

    plan: PlanForApproval
    trajectory: Trajectory  # the turns so far
    question: str | None = None  # set when the run paused before its plan to ask the user (clarification)


@dataclass(frozen=True, slots=True)
class RejectedRun:
    """A durable run whose plan the user rejected: it ends after the plan."""

    trajectory: Trajectory


def validate_question(question: str, max_chars: int) -> str:
    """Return the stripped question, or raise InputError for an empty or over-long one."""
    q = question.strip() if isinstance(question, str) else ""
    if not q:
        raise InputError("the question is empty")
    if len(q) > max_chars:
        raise InputError(f"the question is {len(q):,} characters long; the limit is {max_chars:,}")
    if "\x00" in q:
        raise InputError("the question contains a NUL character")
    try:
        q.encode("utf-8")
    except UnicodeEncodeError as exc:  # undecodable bytes from argv arrive as lone surrogates
        raise InputError("the question is not valid UTF-8 text") from exc
    return q


def prompt_names(deps: AgentDeps, references: Retrieval | None = None) -> tuple[str, ...]:
    """The template files a run uses (their hash is recorded on every turn)."""
    extra = bank.template_names(references) if references is not None else ()
    return ("system", f"instructions/{deps.options.format}", *extra)


def build_messages(question: str, deps: AgentDeps, references: Retrieval | None = None) -> list[ChatMessage]:
    """System prompt (scaffold + offered tools) and user message (bank references, question, format instruction)."""
    return scaffold_messages(question, deps.tools, deps.options.max_tool_calls, deps.options.format, references)


def scaffold_messages(
    question: str,
    tools: Mapping[str, SearchTool],
    max_tool_calls: int,
    format: FormatLabel,
    references: Retrieval | None = None,
) -> list[ChatMessage]:
    """The agent's real system and user messages; SFT data is built with exactly these (learning.sft)."""
    reference_block = bank.reference_block(references) if references is not None else ""
    tool_lines = "\n".join(f"- {name}: {tool.description}" for name, tool in sorted(tools.items()))
    system = prompts.render("system", tools=tool_lines or "- (none configured)", max_tool_calls=str(max_tool_calls))
    instruction = prompts.render(f"instructions/{format}")
    user = "\n\n".join(p for p in (reference_block.strip(), question, instruction) if p)
    return [ChatMessage("system", system), ChatMessage("user", user)]


async def render_prompt(question: str, deps: AgentDeps, references: Retrieval | None = None) -> PromptRecord:
    """Render the prompt (with rubric-bank references, if any) through the policy's chat template; sets
    deps.prompt_sha."""
    deps.started_at = deps.clock()  # the wall-clock budget covers prompt rendering too
    deps.prompt_sha = prompts.prompt_sha(prompt_names(deps, references))
    ctx = await deps.policy.render_prompt(build_messages(question, deps, references))
    return PromptRecord(text=ctx.text, token_ids=ctx.token_ids, prompt_sha=deps.prompt_sha)


def _recursion_limit(deps: AgentDeps) -> int:
    # Each research turn + tool call is two steps; clarification, plan, approval, review and answer and a margin come
    # on top.
    return 2 * deps.options.max_tool_calls + 12


def _trajectory(session_id: str, question: str, prompt: PromptRecord, state: Mapping[str, Any],
                injected_bank_items: tuple[str, ...]) -> Trajectory:
    clarified = (state.get("clarification") or {}).get("prompt_sha")
    current = state.get("prompt")
    if clarified and isinstance(current, PromptContext) and current.text != prompt.text:
        # A clarification answer joined the user message: the turns continue the clarified prompt.
        prompt = PromptRecord(text=current.text, token_ids=tuple(current.token_ids), prompt_sha=str(clarified))
    return Trajectory(
        session_id=session_id,
        question=question,
        prompt=prompt,
        turns=tuple(state.get("turns", [])),
        tool_calls=tuple(state.get("tool_calls", [])),
        malformed=bool(state.get("malformed_stages")),
        max_consecutive_tool_errors=state.get("max_consecutive_tool_errors", 0),
        injected_bank_items=injected_bank_items,
    )


def initial_state(prompt: PromptRecord, approve_plan: bool | None = None,
                  clarify_context: Mapping[str, Any] | None = None, question: str = "") -> dict[str, Any]:
    """The graph's input for a new run (a durable run keeps whether it asks for approval, for its resume; with a
    `clarify_context` it asks whether to clarify the request first). `question` is the user's request as asked: the
    question-first search uses it."""
    state: dict[str, Any] = {"prompt": PromptContext(prompt.text, prompt.token_ids), "turns": [], "tool_calls": [],
                             "question": question}
    if approve_plan is not None:
        state["approve_plan"] = approve_plan
    if clarify_context is not None:
        state["clarify"] = True
        state["clarify_context"] = dict(clarify_context)
    return state


def clarify_context(question: str, deps: AgentDeps, references: Retrieval | None = None) -> dict[str, Any]:
    """What the clarify nodes need to re-render the prompt with the user's answer: the request, the run's messages
    (as plain data, for the checkpoint) and the prompt hash it started with. Call after `render_prompt`."""
    messages = [{"role": m.role, "content": m.content} for m in build_messages(question, deps, references)]
    return {"request": question, "messages": messages, "prompt_sha": deps.prompt_sha}


async def execute(
    session_id: str, question: str, prompt: PromptRecord, deps: AgentDeps, injected_bank_items: tuple[str, ...] = ()
) -> RunResult:
    """Run the graph from a rendered prompt to the answer; turns reach deps.recorder as they are made."""
    if not deps.started_at:
        deps.started_at = deps.clock()
    final = await build_graph().ainvoke(
        initial_state(prompt, question=question), config={"recursion_limit": _recursion_limit(deps)}, context=deps
    )
    traj = _trajectory(session_id, question, prompt, final, injected_bank_items)
    return RunResult(traj, build_report(traj))


async def execute_durable(
    session_id: str,
    question: str,
    prompt: PromptRecord,
    deps: AgentDeps,
    *,
    checkpointer: BaseCheckpointSaver[str],
    thread_id: str,
    start: bool,
    resume_value: Mapping[str, Any] | None = None,
    injected_bank_items: tuple[str, ...] = (),
    clarify_with: Mapping[str, Any] | None = None,
) -> RunResult | PausedRun | RejectedRun:
    """Run (start=True) or continue (from the thread's last checkpoint) a run whose every step is checkpointed.

    `resume_value` answers a paused plan (`agent.approval.PlanDecision.to_dict`) or a clarifying question
    (`agent.clarify.ClarificationAnswer.to_dict`); without it a continued run goes on from where it was cut off (or
    pauses again, if it was waiting for an answer). `clarify_with` (a new run only: `clarify_context`) makes the
    run decide whether to ask the user one question before its plan.
    """
    if not deps.started_at:
        deps.started_at = deps.clock()
    graph_input: Any = initial_state(prompt, deps.approve_plan, clarify_with, question) if start else (
        Command(resume=dict(resume_value)) if resume_value is not None else None)
    config = {"configurable": {"thread_id": thread_id}, "recursion_limit": _recursion_limit(deps)}
    # durability="sync": each step's checkpoint is written before the next step starts. LangGraph's default
    # ("async") writes it while the next step runs, so a process killed early in that step (a crash inside the
    # research node) could leave no checkpoint at all, and the session could not be resumed.
    final = await build_graph(checkpointer).ainvoke(graph_input, config=config, context=deps, durability="sync")
    traj = _trajectory(session_id, question, prompt, final, injected_bank_items)
    interrupts = final.get("__interrupt__") or ()
    if interrupts:
        value = interrupts[0].value
        if isinstance(value, Mapping) and value.get("kind") == "clarification":
            return PausedRun(PlanForApproval.from_dict({}), traj, question=str(value.get("question", "")))
        return PausedRun(PlanForApproval.from_dict(value), traj)
    if (final.get("approval") or {}).get("action") == "reject":
        return RejectedRun(traj)
    return RunResult(traj, build_report(traj), final.get("clarification"))
