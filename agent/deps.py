"""What a run needs, injected as the LangGraph context: policy, tools, recorder, clock and per-run options."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.config import RunOptions
from agent.protocols import PolicyClient, SearchTool
from agent.tools.ids import CallIdFactory
from store.records import PromptRecord, ToolCallRecord, Turn


class RunRecorder(Protocol):
    """Receives every turn and tool call the moment it exists (the session log writes them through)."""

    def turn(self, turn: Turn) -> None:
        """A new piece of the assistant sequence."""
        ...

    def tool_call(self, call: ToolCallRecord) -> None:
        """A tool call finished (successfully or not)."""
        ...

    def event(self, kind: str, data: Mapping[str, Any]) -> None:
        """A progress event for the UI/CLI (stage started, search issued, ...)."""
        ...

    def prompt(self, prompt: PromptRecord) -> None:
        """The prompt changed before any turn (a clarification answer joined the user message; issue 21)."""
        ...


class NullRecorder:
    """A recorder that keeps nothing (runs whose turns are only needed in the returned trajectory)."""

    def turn(self, turn: Turn) -> None:
        pass

    def tool_call(self, call: ToolCallRecord) -> None:
        pass

    def event(self, kind: str, data: Mapping[str, Any]) -> None:
        pass

    def prompt(self, prompt: PromptRecord) -> None:
        pass


@dataclass
class AgentDeps:
    """The graph's context_schema: everything a node may use besides the state."""

    policy: PolicyClient
    tools: Mapping[str, SearchTool]
    options: RunOptions = field(default_factory=RunOptions)
    recorder: RunRecorder = field(default_factory=NullRecorder)
    clock: Callable[[], float] = time.monotonic
    call_ids: CallIdFactory = field(default_factory=CallIdFactory)
    prompt_sha: str = ""
    started_at: float = 0.0  # clock() at run start; set by run_research
    generate_calls: int = 0  # policy calls so far in this run (each gets seed + this, when seeded)
    approve_plan: bool = False  # pause after the plan for the user's approval (needs a checkpointer; issue 21)

    def elapsed(self) -> float:
        """Seconds since the run started."""
        return self.clock() - self.started_at

    def remaining(self) -> float:
        """Seconds left of the wall-clock budget."""
        return self.options.wall_clock_s - self.elapsed()
