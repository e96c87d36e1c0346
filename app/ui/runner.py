"""Runs one research question on a worker thread and hands its events to the page as they come.

Streamlit draws from its script thread only, and the agent runs an asyncio loop: the run gets its own thread and
loop, and the page drains a queue. A page that is left mid-run does not stop the research: the session is finished
and logged all the same, and shows up in the history.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Collection, Iterator
from dataclasses import dataclass

from agent.config import RunOptions
from app import events as ev
from app.service import ResearchOutcome, ResearchService


@dataclass(frozen=True, slots=True)
class RunEnded:
    """The last item of a run's queue: its outcome, or the error that ended it."""

    outcome: ResearchOutcome | None
    error: BaseException | None


class LiveRun:
    """One research run in the background; iterate `events()` on the page's thread."""

    def __init__(self, service: ResearchService, question: str, options: RunOptions,
                 tools: Collection[str] | None = None) -> None:
        self._queue: queue.Queue[ev.Event | RunEnded] = queue.Queue()
        self.ended: RunEnded | None = None
        self._thread = threading.Thread(target=self._work, args=(service, question, options, tools),
                                        name="rubricem-ui-run", daemon=True)
        self._thread.start()

    def _work(self, service: ResearchService, question: str, options: RunOptions,
              tools: Collection[str] | None) -> None:
        try:
            outcome = asyncio.run(service.run(question, options, on_event=self._queue.put, tools=tools))
            self._queue.put(RunEnded(outcome, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the page, which shows it
            self._queue.put(RunEnded(None, exc))

    def events(self, poll_s: float = 0.25) -> Iterator[ev.Event | None]:
        """Events in order until the run ends; None every `poll_s` while nothing happens (to refresh timers)."""
        while self.ended is None:
            try:
                item = self._queue.get(timeout=poll_s)
            except queue.Empty:
                yield None
                continue
            if isinstance(item, RunEnded):
                self.ended = item
                return
            yield item
