"""Helpers for the eval tests: the shipped held-out questions, a scripted model that gives exact answers, and reading
judge requests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from agent.config import RunOptions
from tests.agent.scripts import stage_of

# The corpus-paired HotpotQA/MuSiQue questions the repository ships (learning/sft/data/ATTRIBUTION.md): their context
# titles are in the bundled demo corpus, so the runner tests ask real questions without ../shared.
HELDOUT = Path(__file__).resolve().parents[2] / "learning" / "sft" / "data" / "heldout"

# Byte-level scripted policy: one token per byte, so the context budget must be large.
SCRIPTED_OPTIONS = RunOptions(max_tool_calls=1, temperature=0.0, seed=0, context_tokens=65536)


def answering(answers: dict[str, str]) -> Callable[[str, Sequence[str]], str]:
    """A scaffold-following scripted model that answers `\\boxed{answers[q]}` for the question q in its context."""

    def script(context: str, stop: Sequence[str]) -> str:
        stage = stage_of(stop)
        if stage == "plan":
            return "<structured_plan><research_plan>Search once.</research_plan></structured_plan>"
        if stage == "research":
            if "</tool_output>" not in context:
                return '<call_tool name="local_search">demon spirit Latin translation</call_tool>'
            return "<review><rubric_review>ok</rubric_review><writing_plan>answer</writing_plan></review>"
        if stage == "review":
            return "<rubric_review>ok</rubric_review><writing_plan>answer</writing_plan></review>"
        said = next((a for q, a in answers.items() if q in context), "unknown")
        return f"<answer>\\boxed{{{said}}}</answer>"

    return script


def user_prompt(request_json: dict) -> str:  # type: ignore[type-arg]
    """The user turn of a judge request."""
    return next(m["content"] for m in request_json["messages"] if m["role"] == "user")
