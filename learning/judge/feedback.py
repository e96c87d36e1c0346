"""User feedback notes → persistent Answer-stage rubrics for the judge (issue 7; a decision of this project).

METHOD.md is silent on user feedback (§16 has no decision on it), so this project decides: every non-empty note left
on an answer ("what was missing or wrong") becomes ONE Answer-stage rubric for its question — weight 2 (important),
positive polarity ("the answer addresses this"). Notes that are the same after normalisation collapse into one
rubric; a rating without a note adds nothing (a thumb says *that* an answer was good or bad, not *what* to check).
The id comes from the note itself, so a note maps to the same rubric on every run.

Whose sessions a note judges (issue 34): only its giver's own later sessions of that question (notes they gave on
their own sessions, `store.people.own_feedback`), at most MAX_FEEDBACK_RUBRICS of them, newest first, per judging
run. They reach the judge as `session_rubrics` of a group of that person's sessions: scored there, never saved in the
question's shared rubric buffer. One person's notes therefore never score another person's answers (before, they
scored everyone's sessions of the question, and each judging run saved them into the shared buffer, where they piled
up without a limit), and a deletion of their data takes them all (they live in the feedback table only).

Notes are user text quoted into judge prompts: the judge sees them as rubric content, never as instructions.
"""

from __future__ import annotations

from collections.abc import Sequence

from learning.judge.buffer import normalise_title, rubric_id
from learning.judge.types import Rubric
from store.session_log import FeedbackRecord

__all__ = ["FEEDBACK_TITLE_PREFIX", "FEEDBACK_WEIGHT", "MAX_FEEDBACK_RUBRICS", "feedback_rubrics"]

FEEDBACK_TITLE_PREFIX = "Address user feedback: "
FEEDBACK_WEIGHT = 2  # "important" on the 1-3 scale: a reader's explicit complaint outranks a minor rubric
TITLE_CHARS = 60  # how much of the note the title shows; the description always quotes it whole
MAX_FEEDBACK_RUBRICS = 8  # per question and judging run, newest notes first: many notes must not swamp the rubrics


def _shorten(text: str, limit: int) -> str:
    """The text cut at a word boundary to about `limit` characters, with an ellipsis when cut."""
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0] if " " in text[:limit] else text[:limit]
    return cut.rstrip(" ,;:.-") + "…"


def feedback_rubrics(feedback: Sequence[FeedbackRecord]) -> tuple[Rubric, ...]:
    """One persistent Answer-stage rubric per distinct non-empty feedback note.

    Args:
        feedback: Feedback on sessions of one question, oldest first (`SessionLog.feedback_for_question`).

    Returns:
        The rubrics, oldest note first; at most MAX_FEEDBACK_RUBRICS, keeping the newest distinct notes.
    """
    latest: dict[str, FeedbackRecord] = {}  # normalised note -> its newest record
    for record in feedback:
        note = " ".join(record.note.split())
        key = normalise_title(note)
        if not key:
            continue
        latest.pop(key, None)  # re-insert so a repeated note counts as recent
        latest[key] = record
    kept = list(latest.items())[-MAX_FEEDBACK_RUBRICS:]
    rubrics: list[Rubric] = []
    titles: set[str] = set()
    for key, record in kept:
        note = " ".join(record.note.split())
        title = FEEDBACK_TITLE_PREFIX + _shorten(note, TITLE_CHARS)
        if normalise_title(title) in titles:  # two notes that start alike: the buffer de-duplicates by title
            title = FEEDBACK_TITLE_PREFIX + note
        titles.add(normalise_title(title))
        rated = {"up": " (rated the answer up)", "down": " (rated the answer down)"}.get(record.rating or "", "")
        rubrics.append(Rubric(
            id=rubric_id("answer", "user feedback " + key, persistent=True),
            stage="answer",
            title=title,
            description=(f'A reader of an earlier answer to this question wrote{rated}: "{note}" The answer '
                         "satisfies this rubric when it addresses that point: it covers what the reader found "
                         "missing and avoids what they found wrong."),
            weight=FEEDBACK_WEIGHT,
            polarity="positive",
            persistent=True,
        ))
    return tuple(rubrics)
