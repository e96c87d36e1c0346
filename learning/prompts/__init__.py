"""Judge and grader prompt files, loaded with the agent's checked template loader (`{{name}}` placeholders, all
required, none extra).

`prompt_version()` hashes every judge template plus the system message, and is recorded on each Judgement so scores
made with different prompts can be told apart.
"""

from __future__ import annotations

from functools import cache

from agent.prompts import PromptError, PromptFolder

__all__ = ["JUDGE_TEMPLATES", "SYSTEM_MESSAGE", "PromptError", "messages", "placeholders", "prompt_version",
           "render", "template", "templates_version"]

JUDGE_TEMPLATES: tuple[str, ...] = ("rubric_generation", "stage_scoring", "reflection_judge", "citation_support")

SYSTEM_MESSAGE = (
    "You are a careful, strict evaluator of deep-research agents. Ground every judgement in the text you are shown. "
    "Reply with a single JSON object of the requested shape and nothing else."
)

_FOLDER = PromptFolder(__package__)
template = _FOLDER.template
placeholders = _FOLDER.placeholders
render = _FOLDER.render


def messages(name: str, **variables: str) -> list[dict[str, str]]:
    """The chat messages of one judge call: the shared system message and the rendered template as the user turn."""
    return [{"role": "system", "content": SYSTEM_MESSAGE}, {"role": "user", "content": render(name, **variables)}]


def templates_version(names: tuple[str, ...]) -> str:
    """A short stable hash of the named templates and the shared system message."""
    return _FOLDER.sha(names, salt=SYSTEM_MESSAGE)


@cache
def prompt_version() -> str:
    """A short stable hash of the judge templates and the system message."""
    return templates_version(JUDGE_TEMPLATES)
