"""Runs one research question on a worker thread and hands its events to the page as they come.

Streamlit draws from its script thread only, and the agent runs on asyncio. Every run of the UI process goes on ONE
long-lived event loop in a daemon thread, and the page drains a queue. One loop, not `asyncio.run` per question:
the cached services hold loop-bound objects (the HTTP policy client's kept-alive connections, the service's swap
lock), and a second loop would meet them bound to the first ("Event loop is closed" on every other question with the
vLLM or llama.cpp backends). A page that is left mid-run does not stop the research: the session is finished and
logged all the same, and shows up in the history.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from agent.config import RunOptions
from app import events as ev
from agent.approval import PlanDecision
from agent.clarify import ClarificationAnswer
from app.service import ResearchOutcome, ResearchPaused, ResearchRejected, ResearchService


@dataclass(frozen=True, slots=True)
class RunEnded:
    """The last item of a run's queue: its outcome, or the error that ended it."""

    outcome: ResearchOutcome | ResearchPaused | ResearchRejected | None
    error: BaseException | None


log = logging.getLogger(__name__)
_loop: asyncio.AbstractEventLoop | None = None
_loop_guard = threading.Lock()


def shared_loop() -> asyncio.AbstractEventLoop:
    """The process's research event loop, started on first use in a daemon thread."""
    global _loop
    with _loop_guard:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="rubricem-ui-loop", daemon=True).start()
            _loop = loop
        return _loop


class LiveRun:
    """One research run in the background; iterate `events()` on the page's thread."""

    def __init__(self, service: ResearchService, question: str, options: RunOptions,
                 tools: Collection[str] | None = None,
                 on_event: Callable[[ev.Event], None] | None = None, *, approve_plan: bool = False,
                 resume: tuple[str, PlanDecision | ClarificationAnswer] | None = None) -> None:
        """Start the run (`approve_plan`: pause after the plan; `resume`: answer a paused session's plan or
        clarifying question; whether a question is asked first is the deployment's `sessions.clarify`). `on_event`
        (optional) is called on the loop's thread for every event, before the page sees it: it must be quick and
        thread-safe (the page uses it to file the session in its chat thread, so a page rerun mid-run loses
        nothing)."""
        self._queue: queue.Queue[ev.Event | RunEnded] = queue.Queue()
        self.ended: RunEnded | None = None
        self._on_event = on_event
        work = service.resume(resume[0], resume[1], on_event=self._event) if resume is not None else service.start(
            question, options, on_event=self._event, tools=tools, source="chat", approve_plan=approve_plan)
        self._future: Future[Any] = asyncio.run_coroutine_threadsafe(work, shared_loop())
        self._future.add_done_callback(self._done)

    def _event(self, event: ev.Event) -> None:
        if self._on_event is not None:
            try:
                self._on_event(event)
            except Exception:  # a page hook must never break the research itself
                log.exception("UI run hook failed for %s", type(event).__name__)
        self._queue.put(event)

    def _done(self, future: Future[Any]) -> None:
        try:
            self._queue.put(RunEnded(future.result(), None))
        except BaseException as exc:  # noqa: BLE001 - handed to the page, which shows it
            self._queue.put(RunEnded(None, exc))

    @property
    def running(self) -> bool:
        """True until the research has ended (whether or not the page has drained the queue)."""
        return not self._future.done()

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
