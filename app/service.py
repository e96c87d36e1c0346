"""ResearchService: runs the agent for a question, writes the session turn by turn, emits typed events.

The CLI (and later the Streamlit UI and batch runner) call this; none of them contains research logic.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.config import AgentConfig, RunOptions
from agent.deps import AgentDeps
from agent.errors import AgentError
from agent.protocols import PolicyClient, SearchTool
from agent.report import Report
from agent.run import execute, render_prompt, validate_question
from app import events as ev
from store.records import STAGES, ToolCallRecord, Trajectory, Turn
from store.errors import StoreError
from store.session_log import SessionLog

_log = logging.getLogger(__name__)

EventSink = Callable[[ev.Event], None]


class RunFailedError(Exception):
    """A research run failed; if its session was created (session_id set), it is marked failed in the log."""

    def __init__(self, session_id: str | None, message: str) -> None:
        super().__init__(message)
        self.session_id = session_id


@dataclass(frozen=True, slots=True)
class ResearchOutcome:
    """A completed run."""

    session_id: str
    trajectory: Trajectory
    report: Report
    policy_version: str
    seconds: float


class _SessionRecorder:
    """Writes turns and tool calls through to the session log as they happen and forwards events."""

    def __init__(self, log: SessionLog, session_id: str, sink: EventSink) -> None:
        self.log, self.session_id, self.sink = log, session_id, sink

    def turn(self, turn: Turn) -> None:
        self.log.append_turn(self.session_id, turn)

    def tool_call(self, call: ToolCallRecord) -> None:
        self.log.append_tool_call(self.session_id, call)

    def event(self, kind: str, data: Mapping[str, Any]) -> None:
        self.sink(ev.from_agent(kind, dict(data)))


def stage_summary(traj: Trajectory) -> list[dict[str, Any]]:
    """Per stage: turns, tokens, trainable tokens and whether the model wrote it (for --json and metrics)."""
    out = []
    for stage in STAGES:
        turns = [t for t in traj.turns if t.stage == stage]
        out.append({
            "stage": stage,
            "turns": len(turns),
            "tokens": sum(len(t.token_ids) for t in turns),
            "trainable_tokens": sum(sum(t.mask) for t in turns),
            "sampled": any(t.kind == "sampled" for t in turns),
        })
    return out


def _metrics(traj: Trajectory, report: Report, seconds: float) -> dict[str, Any]:
    return {
        "seconds": round(seconds, 3),
        "tool_calls": len(traj.tool_calls),
        "tool_errors": sum(1 for c in traj.tool_calls if c.error),
        "unknown_citations": report.unknown_citations,
        "references": len(report.references),
        "malformed": traj.malformed,
        "stages": stage_summary(traj),
    }


class ResearchService:
    """Runs research sessions against one policy, one tool set and one session log."""

    def _mark_failed(self, sid: str, message: str, seconds: float) -> None:
        """Mark a session failed; a store failure here is logged, never allowed to hide the run's own error."""
        try:
            self.log.finish(sid, "failed", error=message, metrics={"seconds": round(seconds, 3)})
        except StoreError as store_exc:
            _log.error("could not mark session %s failed: %s (run error: %s)", sid, store_exc, message)

    def __init__(
        self, policy: PolicyClient, tools: Mapping[str, SearchTool], log: SessionLog, config: AgentConfig
    ) -> None:
        self.policy, self.tools, self.log, self.config = policy, dict(tools), log, config

    async def run(
        self, question: str, options: RunOptions | None = None, on_event: EventSink | None = None
    ) -> ResearchOutcome:
        """Research one question. Bad input raises InputError before anything is written.

        Raises:
            InputError: empty or over-long question (nothing written).
            RunFailedError: the run failed after the session was created (session marked failed).
        """
        sink = on_event or (lambda e: None)
        question = validate_question(question, self.config.max_question_chars)
        opts = options or self.config.defaults
        deps = AgentDeps(policy=self.policy, tools=self.tools, options=opts)
        started = time.monotonic()
        try:
            prompt = await render_prompt(question, deps)
            version = self.policy.policy_version
            sid = self.log.create_session(question, prompt, opts.model_dump(mode="json"), version)
        except Exception as exc:  # nothing was written: report it typed, without a session id
            sink(ev.RunFailed(None, f"{type(exc).__name__}: {exc}"))
            if isinstance(exc, AgentError | StoreError):
                raise
            raise RunFailedError(None, f"{type(exc).__name__}: {exc}") from exc
        try:
            sink(ev.SessionStarted(sid, version))
            deps.recorder = _SessionRecorder(self.log, sid, sink)
            result = await execute(sid, question, prompt, deps)
            traj, report = result.trajectory, result.report
            seconds = time.monotonic() - started
            self.log.set_flags(
                sid, malformed=traj.malformed, max_consecutive_tool_errors=traj.max_consecutive_tool_errors
            )
            self.log.finish(sid, "completed", report=report.markdown, metrics=_metrics(traj, report, seconds))
        except BaseException as exc:  # whatever stopped the run (even Ctrl-C), the session is marked failed
            message = f"{type(exc).__name__}: {exc}"
            self._mark_failed(sid, message, time.monotonic() - started)
            sink(ev.RunFailed(sid, message))
            if isinstance(exc, Exception):
                raise RunFailedError(sid, message) from exc
            raise
        sink(ev.AnswerReady(sid, report.markdown))
        return ResearchOutcome(sid, traj, report, version, seconds)
