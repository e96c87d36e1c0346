"""Plan: <think> + <structured_plan> (deep_analysis, rubric, research_plan), ending at </structured_plan>."""

from __future__ import annotations

from typing import Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from agent.deps import AgentDeps
from agent.sequence import SequenceWriter
from agent.state import ResearchState

OPEN, CLOSE = "<structured_plan>", "</structured_plan>"
STOPS = (CLOSE, "</call_tool>", "</answer>")  # the last two guard against skipping the plan


async def plan(state: ResearchState, runtime: Runtime[AgentDeps]) -> Command[Literal["research", "approve"]]:
    """Sample the plan; if the model skipped <structured_plan>, drop that sample, force the tag and sample once more."""
    deps = runtime.context
    deps.recorder.event("stage", {"stage": "plan"})
    w = SequenceWriter(deps, state["prompt"], state.get("turns", []))
    cap = deps.options.token_caps.plan
    gen = await w.sample("plan", STOPS, cap)
    malformed: list[str] = []
    if OPEN in gen.text and gen.stop in (CLOSE, None):
        # Stopped at the closing tag, at EOS or at the length cap with the plan opened: keep it and close it.
        await w.keep_closed("plan", gen, CLOSE)
    else:
        deps.recorder.event("dropped", {"stage": "plan", "reason": "no <structured_plan> in the first sample"})
        await w.insert("plan", OPEN)
        retry = await w.sample("plan", STOPS, cap)
        if retry.stop in (CLOSE, None) and retry.text.strip():
            await w.keep_closed("plan", retry, CLOSE)
        else:
            malformed.append("plan")  # METHOD D7: the stage is absent (R = 0, no tokens)
            await w.insert("plan", CLOSE)
    return Command(
        goto="approve" if deps.approve_plan else "research",
        update={"turns": w.new, "malformed_stages": state.get("malformed_stages", []) + malformed},
    )
