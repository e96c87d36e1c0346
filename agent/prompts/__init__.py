"""Prompt files with a checked interface: `render(name, **vars)` fails on a missing or unused placeholder.

Placeholders are written `{{name}}` so that braces in examples need no escaping. `prompt_sha(names)` hashes the
template files behind a run; it is recorded on every turn, so training data can be filtered by prompt version.
`PromptFolder` is the same loader for any package of `.md` templates (the judge prompts in `learning/prompts` use it).
"""

from __future__ import annotations

import hashlib
import re
from functools import cache
from importlib import resources

_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


class PromptError(ValueError):
    """A template was rendered with missing or unexpected variables, or does not exist."""


class PromptFolder:
    """The `.md` templates of one package."""

    def __init__(self, package: str) -> None:
        """Templates are `<package>/<name>.md`."""
        self.package = package
        self.template = cache(self._read)

    def _read(self, name: str) -> str:
        path = resources.files(self.package).joinpath(f"{name}.md")
        if not path.is_file():
            raise PromptError(f"no prompt template named {name!r} in {self.package}")
        return path.read_text(encoding="utf-8").strip()

    def placeholders(self, name: str) -> set[str]:
        """The variables a template declares."""
        return set(_PLACEHOLDER.findall(self.template(name)))

    def render(self, name: str, **variables: str) -> str:
        """Fill a template; every declared placeholder must be given and nothing else.

        Raises:
            PromptError: unknown template, or missing/unexpected variables.
        """
        wanted = self.placeholders(name)
        missing, extra = wanted - variables.keys(), variables.keys() - wanted
        if missing or extra:
            raise PromptError(f"template {name!r}: missing {sorted(missing)}, unexpected {sorted(extra)}")
        # One pass: a value that itself contains "{{x}}" is inserted verbatim, never re-expanded.
        return _PLACEHOLDER.sub(lambda m: variables[m.group(1)], self.template(name))

    def sha(self, names: list[str] | tuple[str, ...], salt: str = "") -> str:
        """A short stable hash of the named templates' text (plus an optional salt, e.g. a system message)."""
        h = hashlib.sha256(salt.encode())
        for n in names:
            h.update(b"\0" + n.encode() + b"\0" + self.template(n).encode())
        return h.hexdigest()[:16]


_FOLDER = PromptFolder(__package__)
template = _FOLDER.template
placeholders = _FOLDER.placeholders
render = _FOLDER.render


def prompt_sha(names: list[str] | tuple[str, ...]) -> str:
    """A short stable hash of the named agent templates' text."""
    return _FOLDER.sha(names)
