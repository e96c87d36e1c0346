"""What a research run ends in, besides a completed outcome: the failure, the pause for an answer and the rejection,
and the event sink type. Apart from app.service so the resume checks (app.durable_resume) can use them without
importing the service that calls them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agent.approval import PlanForApproval
from app import events as ev

EventSink = Callable[[ev.Event], None]


class RunFailedError(Exception):
    """A research run failed; if its session was created (session_id set), it is marked failed in the log."""

    def __init__(self, session_id: str | None, message: str) -> None:
        super().__init__(message)
        self.session_id = session_id


@dataclass(frozen=True, slots=True)
class ResearchPaused:
    """A durable run waiting for the user's approval of its plan, or (with `question`) for the answer to a
    clarifying question asked before the plan (`ResearchService.resume` goes on)."""

    session_id: str
    plan: PlanForApproval
    expires_at: str
    question: str | None = None


@dataclass(frozen=True, slots=True)
class ResearchRejected:
    """The user rejected the plan: the session ended after it (status failed, never trained on)."""

    session_id: str
