"""Scripted model behaviours for graph tests (what the 'model' says at each stage)."""

from __future__ import annotations

import re
from collections.abc import Sequence

SNIPPET_ID = re.compile(r'<snippet id="([0-9a-f]{8}-[0-9]+)">')


def stage_of(stop: Sequence[str]) -> str:
    """Which node is asking, read from its stop list."""
    if "</structured_plan>" in stop:
        return "plan"
    if "</call_tool>" in stop:
        return "research"
    if "</review>" in stop:
        return "review"
    return "answer"


PLAN = (
    "<think>I need the language of translations in Haymo's era.</think>\n<structured_plan>\n"
    "<deep_analysis>Simple retrieval.</deep_analysis>\n<rubric>Knowledge Checklist: - the language</rubric>\n"
    "<research_plan>Step 1: search Haymo of Faversham.</research_plan>\n</structured_plan>"
)


def well_formed(n_calls: int = 1, tool: str = "local_search", bogus_cite: bool = True):  # noqa: ANN201
    """A model that follows the scaffold: plan, n tool calls, review in the last research turn, cited answer."""

    def script(context: str, stop: Sequence[str]) -> str:
        stage = stage_of(stop)
        if stage == "plan":
            return PLAN + "\n<call_tool name=\"x\">never reached</call_tool>"
        if stage == "research":
            done = context.count("</tool_output>")
            if done < n_calls:
                return f'\n<call_tool name="{tool}">Haymo of Faversham translation {done}</call_tool>'
            return (
                "<think>Enough.</think><state_evaluation>Covered.</state_evaluation>\n<review><rubric_review>"
                "Item 1 satisfied.</rubric_review><writing_plan>State it.</writing_plan></review>"
            )
        if stage == "review":
            return "<rubric_review>ok</rubric_review><writing_plan>write</writing_plan></review>"
        ids = SNIPPET_ID.findall(context)
        cite = ids[0] if ids else "none-0"
        extra = ' Also <cite id="deadbeef-9">an invented claim</cite>.' if bogus_cite else ""
        return f'<answer><think>hidden</think>Books were translated into <cite id="{cite}">Latin</cite>.{extra}</answer>'

    return script


def calls_then_answer(calls: Sequence[str], answer: str):  # noqa: ANN201
    """A model that plans, writes the research turns `calls` in order (whole texts, usually `<call_tool>` blocks),
    then reviews and writes `answer` (a whole `<answer>` block)."""

    def script(context: str, stop: Sequence[str]) -> str:
        stage = stage_of(stop)
        if stage == "plan":
            return PLAN
        if stage == "research":
            done = context.count("</tool_output>")
            if done < len(calls):
                return calls[done]
            return "<review><rubric_review>ok</rubric_review><writing_plan>write</writing_plan></review>"
        if stage == "review":
            return "<rubric_review>ok</rubric_review><writing_plan>write</writing_plan></review>"
        return answer

    return script
