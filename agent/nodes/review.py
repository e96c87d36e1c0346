"""Review: forced <review> after a research turn that did not review, then the sampled rubric review."""

from __future__ import annotations

from typing import Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from agent.deps import AgentDeps
from agent.sequence import SequenceWriter
from agent.state import ResearchState

OPEN, CLOSE = "<review>", "</review>"


async def review(state: ResearchState, runtime: Runtime[AgentDeps]) -> Command[Literal["answer"]]:
    """Force the opening tag, sample to </review>; a sample that runs into </answer> is dropped (stage absent)."""
    deps = runtime.context
    deps.recorder.event("stage", {"stage": "review"})
    w = SequenceWriter(deps, state["prompt"], state.get("turns", []))
    await w.insert("review", "\n" + OPEN)
    gen = await w.sample("review", (CLOSE, "</answer>"), deps.options.token_caps.review)
    malformed: list[str] = []
    if gen.stop == "</answer>" or not gen.text.strip():
        malformed.append("review")
        await w.insert("review", CLOSE)
    else:
        await w.keep_closed("review", gen, CLOSE)
    return Command(
        goto="answer",
        update={"turns": w.new, "malformed_stages": state.get("malformed_stages", []) + malformed},
    )
