"""A user's approved plan rubric → Answer-stage rubrics for the judge of that session (issue 21; a decision of this
project, METHOD.md being silent on it).

When a user EDITS a paused plan (agent.approval), the rubric items they approve are theirs, not the policy's: each
becomes one persistent, positive Answer-stage rubric with weight USER_RUBRIC_WEIGHT = 2 ("important", like a
feedback note: an explicit statement of what the reader wants checked outranks a minor rubric, and stops short of
"critical", which the judge keeps for correctness). An ACCEPTED plan adds nothing: the policy's own rubric is never
the scoring standard (METHOD §5.2), and accepting it does not make it the user's.

The items are user text quoted into judge prompts as rubric content, never as instructions. They are scoped to their
session: the pipeline judges that session in a group of its own and hands the items to the judge as
`session_rubrics`, which are scored for that group only and never saved in the question's shared rubric buffer, so
another session of the same question (another user's, or a later one) is never judged against them.
"""

from __future__ import annotations

from collections.abc import Sequence

from learning.judge.buffer import normalise_title, rubric_id
from learning.judge.types import Rubric
from store.session_log import SessionLog
from store.session_log.checkpoints import SessionRuns

__all__ = ["USER_RUBRIC_TITLE_PREFIX", "USER_RUBRIC_WEIGHT", "session_user_rubrics", "user_rubrics"]

USER_RUBRIC_TITLE_PREFIX = "User's plan rubric: "
USER_RUBRIC_WEIGHT = 2


def user_rubrics(items: Sequence[str]) -> tuple[Rubric, ...]:
    """One Answer-stage rubric per distinct approved item, in the user's order."""
    seen: set[str] = set()
    out: list[Rubric] = []
    for item in items:
        text = " ".join(str(item).split())
        key = normalise_title(text)
        if not key or key in seen:
            continue
        seen.add(key)
        out.append(Rubric(
            id=rubric_id("answer", "user plan rubric " + key, persistent=True),
            stage="answer",
            title=USER_RUBRIC_TITLE_PREFIX + text,
            # Never the owner's id: judge prompts may go to an external API. The owner stays with the approval record
            # (plan_approvals).
            description=(f'The user who asked this question approved this checklist item for the answer: '
                         f'"{text}". The answer satisfies this rubric when it covers that item.'),
            weight=USER_RUBRIC_WEIGHT,
            polarity="positive",
            persistent=True,
        ))
    return tuple(out)


def session_user_rubrics(log: SessionLog, session_id: str) -> tuple[Rubric, ...]:
    """The user rubrics of one session: those of an edited plan; none otherwise."""
    approval = SessionRuns(log).approval(session_id)
    if approval is None or approval.action != "edit":
        return ()
    return user_rubrics(approval.user_rubrics)
