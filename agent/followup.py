"""Follow-up questions in a chat: what the user typed, then earlier exchanges as context after a marker.

A follow-up is a session of its own (judged and learned from like any other), so its question must stand alone; the
marker lets titles and history show only the user's words (`typed_question`).
"""

from __future__ import annotations

__all__ = ["FOLLOW_UP_MARK", "follow_up_question", "typed_question"]

FOLLOW_UP_MARK = "\n\n---\nEarlier in this chat:"
_EARLIER_ANSWER_CHARS = 600


def follow_up_question(typed: str, earlier: list[tuple[str, str]], max_chars: int) -> str:
    """The question researched for a follow-up: what the user typed, then the last two exchanges as context.

    A follow-up is a session of its own (judged and learned from like any other), so its question must stand
    alone; the context goes after a marker so `typed_question` can show the user's words. The answers are cut to
    600 characters and the oldest context is dropped first to stay within `max_chars`.
    """
    typed = typed.strip()
    blocks = [f"Q: {typed_question(q)}\nA: {' '.join(a.split())[:_EARLIER_ANSWER_CHARS]}" for q, a in earlier[-2:]]
    while blocks:
        text = typed + FOLLOW_UP_MARK + "\n" + "\n\n".join(blocks)
        if len(text) <= max_chars:
            return text
        blocks.pop(0)
    return typed


def typed_question(question: str) -> str:
    """What the user typed (a follow-up's context removed)."""
    return question.split(FOLLOW_UP_MARK, 1)[0]
