"""Rubric-bank injection (METHOD §7.4): retrieved reflections become a `<reference_examples>` block that goes into the
user message before the question, so the agent reads them before it plans.

Within-episode (the same question was attempted before) and cross-episode (similar questions, separated by `---`)
have their own preambles. The block is context: it sits in the prompt and is never trained.
"""

from __future__ import annotations

from agent import prompts
from store.records import Retrieval

TEMPLATES = {"within": ("reference_within",), "cross": ("reference_cross", "reference_item")}


def reference_block(retrieval: Retrieval) -> str:
    """The `<reference_examples>` block for a retrieval ("" when nothing was retrieved)."""
    if retrieval.mode == "none" or not retrieval.hits:
        return ""
    if retrieval.mode == "within":
        item = retrieval.hits[0].item
        return prompts.render("reference_within", rubrics=item.rubrics, takeaways=item.takeaways)
    items = "\n---\n".join(
        prompts.render("reference_item", number=str(i), question=h.item.question, rubrics=h.item.rubrics,
                       takeaways=h.item.takeaways)
        for i, h in enumerate(retrieval.hits, start=1)
    )
    return prompts.render("reference_cross", items=items)


def template_names(retrieval: Retrieval) -> tuple[str, ...]:
    """The templates a block used (part of the prompt hash recorded on every turn)."""
    return TEMPLATES.get(retrieval.mode, ()) if retrieval.hits else ()
