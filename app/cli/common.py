"""What the `rubricem` subcommand modules share: stderr progress lines and per-run options from the command line.

The subcommand modules (`app/cli/*.py`) import from here, never from `app.cli.main`, so `app.cli.main` can import them
without a cycle.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from agent.config import RunOptions
from agent.errors import InputError
from app import events as ev
from app.settings import Settings


class Progress:
    """Stage-by-stage progress lines on stderr, with elapsed seconds."""

    def __init__(self, quiet: bool = False) -> None:
        self.start = time.monotonic()
        self.quiet = quiet
        self._last_bar = 0.0

    def say(self, message: str) -> None:
        if not self.quiet:
            print(f"[{time.monotonic() - self.start:6.1f}s] {message}", file=sys.stderr, flush=True)

    def bar(self, done: int, total: int) -> None:
        now = time.monotonic()
        if self.quiet or (now - self._last_bar < 2.0 and done < total):
            return
        self._last_bar = now
        self.say(f"  indexed {done:,}/{total:,} passages ({100 * done // max(total, 1)}%)")

    def event(self, e: ev.Event) -> None:
        match e:
            case ev.SessionStarted(session_id=sid, policy_version=v):
                self.say(f"session {sid} started (policy {v})")
            case ev.ReferencesInjected(mode=mode, items=items):
                what = "an earlier attempt at this question" if mode == "within" else f"{len(items)} similar question(s)"
                self.say(f"rubric bank: using reflections from {what}")
            case ev.StageStarted(stage="research", final=True):
                self.say("research: last turn, without tools")
            case ev.StageStarted(stage="research", turn=n):
                self.say(f"research: turn {n}")
            case ev.StageStarted(stage=stage):
                self.say(f"{stage}")
            case ev.SearchIssued(tool=tool, query=query):
                self.say(f"  {tool}: {query[:100]!r}")
            case ev.SearchDone(tool=tool, results=n, error=err):
                self.say(f"  {tool}: {'error: ' + err if err else f'{n} results'}")
            case ev.SessionResumed(session_id=sid, dropped_turns=n):
                self.say(f"session {sid} resumed from its last checkpoint"
                         + (f" ({n} turn(s) written after it are made again)" if n else ""))
            case ev.Note(kind="research_stopped", data=d):
                self.say(f"  research stopped ({d.get('reason')}) after {d.get('tool_calls')} tool calls")
            case _:
                pass


def run_options(settings: Settings, args: argparse.Namespace) -> RunOptions:
    values: dict[str, Any] = settings.agent.defaults.model_dump()
    for name in ("format", "max_tool_calls", "seed", "temperature", "wall_clock_s"):
        if getattr(args, name, None) is not None:
            values[name] = getattr(args, name)
    return RunOptions.model_validate(values)


def with_adapter(settings: Settings, adapter: str | None) -> Settings:
    """Settings with `--adapter`: a LoRA folder, or `none` for the plain base model (no shipped SFT adapter)."""
    if not adapter:
        return settings
    if adapter == "none":
        update: dict[str, Any] = {"embedded_adapter_path": None, "embedded_sft": False}
    elif not (Path(adapter) / "adapter_config.json").is_file():
        raise InputError(f"--adapter {adapter}: not a LoRA adapter folder (adapter_config.json missing)")
    else:
        update = {"embedded_adapter_path": Path(adapter)}
    return settings.model_copy(update={"agent": settings.agent.model_copy(update=update)})
