"""A teacher's trajectory, the rejection rules (METHOD §10.4), post-processing (§10.5) and the ChatML example.

A trajectory is a list of segments: `model` text the teacher wrote (one segment per round) and `tool` text the
project's own tools returned (`<tool_output>…</tool_output>`, rendered exactly as in a research session). Every
teacher's output passes `postprocess` and then `rejection_reason` before anything is written.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from agent.parse import CallParseError, parse_tool_call
from agent.protocols import ChatMessage
from agent.tools.names import resolve_tool_name

SegmentKind = Literal["model", "tool"]

# Rejection reasons, counted per reason in the generation report. The first four are §10.4's rules.
NO_ANSWER = "no_answer"  # 1. no </answer>
BAD_TOOL_CALL = "bad_tool_call"  # 2. a non-final round without a valid, parseable </call_tool>
MISSING_STRUCTURE = "missing_structure"  # 3. plan/rubric/state evaluation missing, an answer in round 1
MALFORMED_TAGS = "malformed_tags"  # 3. tags not properly nested or closed
TOOL_ERRORS = "consecutive_tool_errors"  # 4. two tool-error rounds in a row
TOO_LONG = "too_long"  # longer than the context window (never truncated into training data)
TEACHER_ERROR = "teacher_error"  # the teacher timed out or returned an error/garbage
EVIDENCE_NOT_FOUND = "evidence_not_found"  # evidence teacher: a hop's gold passage was not retrieved
REASONS = (NO_ANSWER, BAD_TOOL_CALL, MISSING_STRUCTURE, MALFORMED_TAGS, TOOL_ERRORS, TOO_LONG, TEACHER_ERROR,
           EVIDENCE_NOT_FOUND)

_BLOCK_TAGS = ("think", "structured_plan", "deep_analysis", "rubric", "research_plan", "call_tool", "state_evaluation",
               "review", "rubric_review", "writing_plan", "answer", "cite")
_TAG = re.compile(r"<(/?)(" + "|".join(_BLOCK_TAGS) + r")\b[^<>]*>", re.IGNORECASE)
_TOOL_OUTPUT_ERROR = re.compile(r"^\s*<tool_output>\s*Error:", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Segment:
    """One round's text: written by the teacher (`model`) or returned by a tool (`tool`)."""

    kind: SegmentKind
    text: str


@dataclass(slots=True)
class Trajectory:
    """A teacher's multi-round trajectory for one question."""

    question_id: str
    teacher: str  # which teacher wrote it, e.g. "evidence-chain/1" or "llm:gpt-x"
    format: str
    max_tool_calls: int
    segments: list[Segment] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # tool, query, snippet_ids, error

    def model_text(self) -> str:
        """Everything the teacher wrote (tool outputs left out)."""
        return "".join(s.text for s in self.segments if s.kind == "model")

    def retrieved_ids(self) -> set[str]:
        """Every snippet id a tool returned in this trajectory."""
        return {i for c in self.tool_calls for i in c.get("snippet_ids", ())}


# -- post-processing (§10.5) -------------------------------------------------------------------------------------------

_SCRATCH = re.compile(r"<(/?)scratchpad>", re.IGNORECASE)
_CALL_NAME = re.compile(r'(<call_tool\b[^>]*?\bname\s*=\s*)(["\']?)([^"\'\s>]+)\2', re.IGNORECASE)
_CALL_ALIAS = re.compile(r"<(/?)call\b([^>]*)>", re.IGNORECASE)  # <call ...> but not <call_tool ...>


def postprocess(text: str, tools: Sequence[str]) -> str:
    """`<scratchpad>` -> `<think>`, `<call>` -> `<call_tool>`, tool-name variants -> the offered tool's name."""
    text = _SCRATCH.sub(lambda m: f"<{m.group(1)}think>", text)
    text = _CALL_ALIAS.sub(lambda m: f"<{m.group(1)}call_tool{m.group(2)}>", text)
    offered = {t: t for t in tools}

    def fix(m: re.Match[str]) -> str:
        name = resolve_tool_name(m.group(3), offered) or m.group(3)
        return f'{m.group(1)}"{name}"'

    return _CALL_NAME.sub(fix, text)


# -- rejection rules (§10.4) -------------------------------------------------------------------------------------------


def tags_balanced(text: str) -> bool:
    """Whether the scaffold's block tags in `text` open and close in proper nesting."""
    stack: list[str] = []
    for m in _TAG.finditer(text):
        closing, name = m.group(1) == "/", m.group(2).lower()
        if not closing:
            stack.append(name)
        elif not stack or stack.pop() != name:
            return False
    return not stack


def _valid_call(text: str, tools: Sequence[str]) -> bool:
    if not text.rstrip().endswith("</call_tool>"):
        return False
    try:
        call = parse_tool_call(text)
    except CallParseError:
        return False
    return bool(call.query.strip()) and call.name in tools


def rejection_reason(traj: Trajectory, tools: Sequence[str]) -> str | None:
    """The first §10.4 rule the trajectory breaks, or None when it is kept.

    Rounds alternate model, tool, model, …; the last round is the model's and must hold the answer.
    """
    segs = traj.segments
    rounds = [s for s in segs if s.kind == "model"]
    if not rounds or "</answer>" not in rounds[-1].text or "<answer>" not in rounds[-1].text:
        return NO_ANSWER
    if any(a.kind == b.kind for a, b in zip(segs, segs[1:], strict=False)) or segs[0].kind != "model":
        return BAD_TOOL_CALL  # two model rounds without a tool output between them: a round that called nothing
    for r in rounds[:-1]:
        if "<answer>" in r.text:
            return MISSING_STRUCTURE if r is rounds[0] else BAD_TOOL_CALL
        if not _valid_call(r.text, tools):
            return BAD_TOOL_CALL
    if len(rounds) < 2:
        return MISSING_STRUCTURE  # answered in round 1 without searching
    first = rounds[0].text
    if not first.lstrip().startswith("<think>") or not all(
        t in first for t in ("<structured_plan>", "<deep_analysis>", "<rubric>", "</structured_plan>")
    ):
        return MISSING_STRUCTURE
    if any("<state_evaluation>" not in r.text for r in rounds[1:]):
        return MISSING_STRUCTURE
    if "<review>" not in rounds[-1].text:
        return MISSING_STRUCTURE
    if not all(tags_balanced(r.text) for r in rounds):
        return MALFORMED_TAGS
    errors = [bool(_TOOL_OUTPUT_ERROR.match(s.text)) for s in segs if s.kind == "tool"]
    if any(a and b for a, b in zip(errors, errors[1:], strict=False)):
        return TOOL_ERRORS
    return None


# -- the training example (§10.5) --------------------------------------------------------------------------------------


def to_example(traj: Trajectory, messages: Sequence[ChatMessage], tokens: int | None = None) -> dict[str, Any]:
    """One three-message ChatML conversation; `tool_spans` are [start, end) character offsets of the tool outputs
    inside the assistant message (they get no gradient)."""
    assistant, spans, pos = [], [], 0
    for s in traj.segments:
        if s.kind == "tool":
            spans.append([pos, pos + len(s.text)])
        assistant.append(s.text)
        pos += len(s.text)
    return {
        "id": traj.question_id,
        "teacher": traj.teacher,
        "format": traj.format,
        "messages": [{"role": m.role, "content": m.content} for m in messages]
        + [{"role": "assistant", "content": "".join(assistant)}],
        "tool_spans": spans,
        "tool_calls": traj.tool_calls,
        "segments": [asdict(s) for s in traj.segments],
        "tokens": tokens,
    }


def example_spans(example: Mapping[str, Any]) -> list[tuple[int, int]]:
    """The tool-output spans of a stored example, checked against its assistant message."""
    content = example["messages"][-1]["content"]
    spans = [(int(a), int(b)) for a, b in example.get("tool_spans", [])]
    for a, b in spans:
        if not (0 <= a < b <= len(content)) or not content[a:b].lstrip().startswith("<tool_output>"):
            raise ValueError(f"example {example.get('id')!r}: tool span {a}-{b} does not cover a <tool_output>")
    return spans
