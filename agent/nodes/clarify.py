"""Clarify: before Plan, one short policy call decides whether the request is too ambiguous to research, and if so
the run pauses with one question for the user (LangGraph `interrupt`, like plan approval).

Reached only when the run asked for clarification (the `clarify` flag of the graph's input; a durable run's
checkpoint keeps it). The decision call is separate from the research prompt and is NOT part of the training
trajectory (agent/clarify.py). Two nodes, so that the decision is checkpointed before the pause: a resume re-runs
only `await_clarification`, whose `interrupt` then returns the user's answer instead of pausing, and never samples
a second, different question.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from langgraph.runtime import Runtime
from langgraph.types import Command, interrupt

from agent import prompts, telemetry
from agent.clarify import (
    DECISION_STOPS,
    DECISION_TOKENS,
    ClarificationAnswer,
    ClarifyDecision,
    clarified_messages,
    clarified_prompt_sha,
    decision_messages,
)
from agent.deps import AgentDeps
from agent.errors import BudgetExceeded
from agent.protocols import PromptContext
from agent.sequence import policy_model
from agent.state import ResearchState
from store.records import PromptRecord


async def clarify(state: ResearchState, runtime: Runtime[AgentDeps]) -> Command[Literal["await_clarification", "plan"]]:
    """Ask the policy (a small separate prompt) whether to ask the user one question; record what it said."""
    deps = runtime.context
    context: dict[str, Any] = dict(state.get("clarify_context") or {})
    remaining = deps.remaining()
    if remaining <= 0:
        raise BudgetExceeded(f"wall-clock limit of {deps.options.wall_clock_s:.0f} s reached before clarification")
    deps.recorder.event("clarifying", {})
    try:
        prompt = await deps.policy.render_prompt(decision_messages(str(context.get("request", ""))))
        with telemetry.policy_call(stage="clarify", model=policy_model(deps), input_tokens=len(prompt.token_ids),
                                   max_tokens=DECISION_TOKENS, temperature=0.0,
                                   policy_version=deps.policy.policy_version) as traced:
            gen = await asyncio.wait_for(
                deps.policy.generate(prompt, stop=list(DECISION_STOPS), max_tokens=DECISION_TOKENS, temperature=0.0,
                                     seed=deps.options.seed),
                timeout=remaining)
            traced.finish(output_tokens=len(gen.token_ids), finish_reason=gen.finish_reason)
    except TimeoutError as exc:
        raise BudgetExceeded(
            f"wall-clock limit of {deps.options.wall_clock_s:.0f} s reached while deciding on clarification") from exc
    decision = ClarifyDecision.parse(gen.text, cut=gen.finish_reason == "length")
    record: dict[str, Any] = {"status": decision.status, "question": decision.question, "answer": "",
                              "raw": decision.raw, "decision_prompt_sha": prompts.prompt_sha(["clarify"])}
    deps.recorder.event("clarification", {"status": decision.status, "question": decision.question})
    return Command(goto="await_clarification" if decision.status == "asked" else "plan",
                   update={"clarification": record})


async def await_clarification(state: ResearchState, runtime: Runtime[AgentDeps]) -> Command[Literal["plan"]]:
    """Pause with the question; an answer goes into the user message Plan sees, an empty one changes nothing."""
    deps = runtime.context
    record: dict[str, Any] = dict(state.get("clarification") or {})
    answer = ClarificationAnswer.parse(interrupt({"kind": "clarification", "question": record.get("question", "")}))
    record["owner"] = answer.owner
    if not answer.text:
        record.update(status="skipped", answer="")
        deps.recorder.event("clarification", {"status": "skipped", "question": record.get("question", "")})
        return Command(goto="plan", update={"clarification": record})
    context: dict[str, Any] = dict(state.get("clarify_context") or {})
    messages = clarified_messages(context.get("messages", []), str(context.get("request", "")),
                                  str(record.get("question", "")), answer.text)
    rendered = await deps.policy.render_prompt(messages)
    # From the prompt hash the run started with (kept in the state), so a repeated node never hashes twice.
    sha = clarified_prompt_sha(str(context.get("prompt_sha", deps.prompt_sha)))
    deps.prompt_sha = sha
    record.update(status="answered", answer=answer.text, prompt_sha=sha)
    deps.recorder.prompt(PromptRecord(text=rendered.text, token_ids=rendered.token_ids, prompt_sha=sha))
    deps.recorder.event("clarification", {"status": "answered", "question": record.get("question", ""),
                                          "answer": answer.text})
    return Command(goto="plan", update={"clarification": record,
                                        "prompt": PromptContext(rendered.text, rendered.token_ids)})
