"""Answer: <answer> ... </answer> with <cite id=...> claims."""

from __future__ import annotations

from langgraph.graph import END
from langgraph.runtime import Runtime
from langgraph.types import Command

from agent.deps import AgentDeps
from agent.parse import strip_think
from agent.sequence import SequenceWriter
from agent.state import ResearchState

OPEN, CLOSE = "<answer>", "</answer>"


async def answer(state: ResearchState, runtime: Runtime[AgentDeps]) -> Command[str]:
    """Sample the answer; if it does not open with <answer>, drop it, force the tag and sample once more."""
    deps = runtime.context
    deps.recorder.event("stage", {"stage": "answer"})
    w = SequenceWriter(deps, state["prompt"], state.get("turns", []))
    cap = deps.options.token_caps.answer
    gen = await w.sample("answer", (CLOSE,), cap)
    malformed: list[str] = []
    if strip_think(gen.text).lstrip().startswith(OPEN):  # a <think> before the answer is allowed
        await w.keep_closed("answer", gen, CLOSE)
    else:
        deps.recorder.event("dropped", {"stage": "answer", "reason": "the answer did not open with <answer>"})
        await w.insert("answer", "\n" + OPEN)
        retry = await w.sample("answer", (CLOSE,), cap)
        if retry.text.strip():
            await w.keep_closed("answer", retry, CLOSE)
        else:
            malformed.append("answer")
            await w.insert("answer", CLOSE)
    return Command(goto=END, update={"turns": w.new, "malformed_stages": state.get("malformed_stages", []) + malformed})
