"""Judge prompt files with a checked interface, like `agent.prompts`: `{{name}}` placeholders, all required, none extra.

`PROMPT_VERSION` hashes every judge template plus the system message, and is recorded on each Judgement so scores
made with different prompts can be told apart.
"""

from __future__ import annotations

import hashlib
import re
from functools import cache
from importlib import resources

_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")

JUDGE_TEMPLATES: tuple[str, ...] = ("rubric_generation", "stage_scoring", "reflection_judge", "citation_support")

SYSTEM_MESSAGE = (
    "You are a careful, strict evaluator of deep-research agents. Ground every judgement in the text you are shown. "
    "Reply with a single JSON object of the requested shape and nothing else."
)


class PromptError(ValueError):
    """A template does not exist, or was rendered with missing or unexpected variables."""


@cache
def template(name: str) -> str:
    """The raw text of `learning/prompts/<name>.md`."""
    path = resources.files(__package__).joinpath(f"{name}.md")
    if not path.is_file():
        raise PromptError(f"no judge prompt template named {name!r}")
    return path.read_text(encoding="utf-8").strip()


def placeholders(name: str) -> set[str]:
    """The variables a template declares."""
    return set(_PLACEHOLDER.findall(template(name)))


def render(name: str, **variables: str) -> str:
    """Fill a template; every declared placeholder must be given and nothing else.

    Raises:
        PromptError: unknown template, or missing/unexpected variables.
    """
    wanted = placeholders(name)
    missing, extra = wanted - variables.keys(), variables.keys() - wanted
    if missing or extra:
        raise PromptError(f"template {name!r}: missing {sorted(missing)}, unexpected {sorted(extra)}")
    # One pass over the template: a value that itself contains "{{x}}" is inserted verbatim, never re-expanded.
    return _PLACEHOLDER.sub(lambda m: variables[m.group(1)], template(name))


def messages(name: str, **variables: str) -> list[dict[str, str]]:
    """The chat messages of one judge call: the shared system message and the rendered template as the user turn."""
    return [{"role": "system", "content": SYSTEM_MESSAGE}, {"role": "user", "content": render(name, **variables)}]


@cache
def prompt_version() -> str:
    """A short stable hash of the judge templates and the system message."""
    h = hashlib.sha256(SYSTEM_MESSAGE.encode())
    for n in JUDGE_TEMPLATES:
        h.update(b"\0" + n.encode() + b"\0" + template(n).encode())
    return h.hexdigest()[:16]
