"""Clarification before planning (issue 21): the policy's one-line decision, its parsing, the user's answer, and the
block the answer puts into the user message that Plan sees.

The decision is a small, separate policy call (`agent/prompts/clarify.md`: the request alone, at temperature 0, a
few dozen tokens). It is NOT part of the training trajectory: no turn is recorded for it, it does not count towards
the run's seeded calls, and its output only decides whether one question goes to the user. Output that cannot be
read is no question (status "malformed", with the raw text kept in the record). An empty answer means "go on without
clarification": the prompt is left as it was.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agent import prompts
from agent.protocols import ChatMessage

ClarifyStatus = Literal["clear", "asked", "answered", "skipped", "malformed"]
DECISION_TOKENS = 96
DECISION_STOPS = ("\n\n", "<|im_end|>", "</s>")
MAX_QUESTION_CHARS = 300
MAX_ANSWER_CHARS = 2000
RAW_KEPT_CHARS = 500
_ASK = re.compile(r"^\s*(?:\*\*)?ASK(?:\*\*)?\s*[:\-]\s*(.+)$", re.IGNORECASE)
_CLEAR = re.compile(r"^\s*(?:\*\*)?CLEAR\b", re.IGNORECASE)


class ClarificationError(ValueError):
    """An answer that cannot be applied; the session stays paused."""


@dataclass(frozen=True, slots=True)
class ClarifyDecision:
    """What the decision call said: a question for the user, clear, or unreadable output."""

    status: Literal["clear", "asked", "malformed"]
    question: str = ""
    raw: str = ""

    @classmethod
    def parse(cls, text: str, *, cut: bool = False) -> ClarifyDecision:
        """`CLEAR` or `ASK: <question>` on the first non-empty line; anything else is malformed (no question), and so
        is a question that the token cap cut off (`cut`, when it is still on its first line)."""
        raw = text[:RAW_KEPT_CHARS]
        lines = [line for line in text.strip().splitlines() if line.strip()]
        if cut and len(lines) == 1 and _ASK.match(lines[0].strip()):
            return cls("malformed", raw=raw)
        if not lines:
            return cls("malformed", raw=raw)
        first = lines[0].strip()
        if _CLEAR.match(first):
            return cls("clear", raw=raw)
        m = _ASK.match(first)
        if m is None:
            return cls("malformed", raw=raw)
        question = " ".join(re.sub(r"<[^>]*>", " ", m.group(1)).replace("<", " ").replace(">", " ").split())
        question = question.strip(" *\"'")
        if len(question) < 3 or len(question) > MAX_QUESTION_CHARS or not re.search(r"\w", question):
            return cls("malformed", raw=raw)
        return cls("asked", question=question, raw=raw)


def decision_messages(question: str) -> list[ChatMessage]:
    """The decision call's messages: the short instruction and the request (no tools, no bank, no format)."""
    return [ChatMessage("system", prompts.render("clarify")), ChatMessage("user", question)]


@dataclass(frozen=True, slots=True)
class ClarificationAnswer:
    """The user's answer to the clarifying question (empty: go on without clarification)."""

    text: str
    owner: str = "local"

    def to_dict(self) -> dict[str, Any]:
        """The `Command(resume=...)` value (plain data, so the checkpoint stores it as is)."""
        return {"kind": "clarification", "answer": self.text, "owner": self.owner}

    @classmethod
    def parse(cls, data: object) -> ClarificationAnswer:
        """A string, or a mapping with `answer` (and `owner`); raises ClarificationError for anything else."""
        if isinstance(data, str):
            text, owner = data, "local"
        elif isinstance(data, Mapping):
            text, owner = data.get("answer", ""), str(data.get("owner") or "local")
            if not isinstance(text, str):
                raise ClarificationError("the answer must be text")
        else:
            raise ClarificationError("the answer must be text")
        text = " ".join(text.split())
        if len(text) > MAX_ANSWER_CHARS:
            raise ClarificationError(f"the answer is longer than {MAX_ANSWER_CHARS} characters")
        if "\x00" in text:
            raise ClarificationError("the answer contains a NUL character")
        return cls(text, owner)


def clarification_block(question: str, answer: str) -> str:
    """The text added to the user message after the request."""
    return prompts.render("clarification", question=question, answer=answer)


def clarified_messages(messages: Sequence[Mapping[str, str]], request: str, question: str,
                       answer: str) -> list[ChatMessage]:
    """The run's messages with the clarification right after the request in the user message (at its end when the
    request cannot be found there)."""
    block = clarification_block(question, answer)
    out: list[ChatMessage] = []
    for m in messages:
        content = m["content"]
        if m["role"] == "user":
            content = (content.replace(request, f"{request}\n\n{block}", 1) if request and request in content
                       else f"{content}\n\n{block}")
        out.append(ChatMessage(m["role"], content))
    return out


def clarified_prompt_sha(prompt_sha: str) -> str:
    """The prompt hash of a clarified prompt: the run's templates plus the clarification block's."""
    return prompts.PromptFolder("agent.prompts").sha(["clarification"], salt=prompt_sha)
