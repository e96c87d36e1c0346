"""Typed events a research run emits, consumed by the CLI (and later the UI and batch runner)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from store.records import Snippet


@dataclass(frozen=True, slots=True)
class SessionStarted:
    """The session exists in the log."""

    session_id: str
    policy_version: str


@dataclass(frozen=True, slots=True)
class BankReference:
    """One rubric-bank item put into the prompt."""

    item_id: str
    question: str
    similarity: float


@dataclass(frozen=True, slots=True)
class ReferencesInjected:
    """Rubric-bank reflections were put into the prompt: within-episode (same question) or cross-episode."""

    mode: str
    items: tuple[BankReference, ...]


@dataclass(frozen=True, slots=True)
class StageStarted:
    """The graph entered a stage (research carries the turn number)."""

    stage: str
    turn: int | None = None
    final: bool = False  # research only: the tool-free turn after the tool budget


@dataclass(frozen=True, slots=True)
class SearchIssued:
    """A tool call is running."""

    tool: str
    query: str


@dataclass(frozen=True, slots=True)
class SearchDone:
    """A tool call finished."""

    tool: str
    results: int
    error: str | None


@dataclass(frozen=True, slots=True)
class SourcesFound:
    """What a finished tool call returned (the UI lists the sources under their search)."""

    tool: str
    query: str
    sources: tuple[Snippet, ...]
    error: str | None


@dataclass(frozen=True, slots=True)
class TurnWritten:
    """A turn was appended to the trajectory: the model's text (sampled) or text the scaffold inserted."""

    stage: str
    kind: str
    text: str


@dataclass(frozen=True, slots=True)
class Note:
    """Anything else worth showing (research stopped early, a sample dropped, ...)."""

    kind: str
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class AnswerReady:
    """The run completed with a report."""

    session_id: str
    report: str


@dataclass(frozen=True, slots=True)
class RunFailed:
    """The run failed; the session is marked failed in the log."""

    session_id: str | None
    error: str


@dataclass(frozen=True, slots=True)
class PlanAwaitingApproval:
    """The session paused after its plan (issue 21): accept, edit or reject it to go on."""

    session_id: str
    plan: dict[str, Any]  # agent.approval.PlanForApproval.to_dict()
    expires_at: str


@dataclass(frozen=True, slots=True)
class ClarificationRequested:
    """The session paused before its plan with one question for the user (issue 21): answer it to go on."""

    session_id: str
    question: str
    expires_at: str


@dataclass(frozen=True, slots=True)
class SessionResumed:
    """A cut-off or paused session goes on from its last checkpoint."""

    session_id: str
    dropped_turns: int  # turns written after the last checkpoint, made again


Event = (
    SessionStarted | ReferencesInjected | StageStarted | SearchIssued | SearchDone | SourcesFound | TurnWritten | Note
    | AnswerReady | RunFailed | PlanAwaitingApproval | ClarificationRequested | SessionResumed
)


def from_agent(kind: str, data: dict[str, Any]) -> Event:
    """Map the agent's recorder events to typed events."""
    if kind == "stage":
        return StageStarted(str(data["stage"]), data.get("turn"), bool(data.get("final", False)))
    if kind == "search":
        return SearchIssued(str(data["tool"]), str(data["query"]))
    if kind == "search_done":
        return SearchDone(str(data["tool"]), int(data["results"]), data.get("error"))
    return Note(kind, dict(data))
