"""Prompt files with a checked interface: `render(name, **vars)` fails on a missing or unused placeholder.

Placeholders are written `{{name}}` so that braces in examples need no escaping. `prompt_sha(names)` hashes the
template files behind a run; it is recorded on every turn, so training data can be filtered by prompt version.
"""

from __future__ import annotations

import hashlib
import re
from functools import cache
from importlib import resources

_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


class PromptError(ValueError):
    """A template was rendered with missing or unexpected variables, or does not exist."""


@cache
def template(name: str) -> str:
    """The raw text of `agent/prompts/<name>.md` (e.g. "system", "instructions/long_form")."""
    path = resources.files(__package__).joinpath(f"{name}.md")
    if not path.is_file():
        raise PromptError(f"no prompt template named {name!r}")
    return path.read_text(encoding="utf-8").strip()


def placeholders(name: str) -> set[str]:
    """The variables a template declares."""
    return set(_PLACEHOLDER.findall(template(name)))


def render(name: str, **variables: str) -> str:
    """Fill a template; every declared placeholder must be given and nothing else."""
    wanted = placeholders(name)
    missing, extra = wanted - variables.keys(), variables.keys() - wanted
    if missing or extra:
        raise PromptError(f"template {name!r}: missing {sorted(missing)}, unexpected {sorted(extra)}")
    return _PLACEHOLDER.sub(lambda m: variables[m.group(1)], template(name))


def prompt_sha(names: list[str] | tuple[str, ...]) -> str:
    """A short stable hash of the named templates' text."""
    h = hashlib.sha256()
    for n in names:
        h.update(n.encode())
        h.update(b"\0")
        h.update(template(n).encode())
    return h.hexdigest()[:16]
