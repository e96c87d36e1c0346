"""Runs one research question on a worker thread and hands its events to the page as they come.

Streamlit draws from its script thread only, and the agent runs on asyncio. Every run of the UI process goes on ONE
long-lived event loop in a daemon thread, and the page drains a queue. One loop, not `asyncio.run` per question:
the cached services hold loop-bound objects (the HTTP policy client's kept-alive connections, the service's swap
lock), and a second loop would meet them bound to the first ("Event loop is closed" on every other question with the
vLLM or llama.cpp backends). A page that is left mid-run does not stop the research: the session is finished and
logged all the same, and shows up in the history.

Because a left page does not stop a run, the caps are enforced here, where every chat run starts, not in the
widgets (issue 34): runs going at once per person and in total (one model serves them all), and for non-admins the
time limit and tool-call budget of each run. A run over a cap is refused before anything starts or is written.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from agent.approval import PlanDecision
from agent.clarify import ClarificationAnswer
from agent.config import RunOptions
from agent.errors import InputError
from app import events as ev
from app.service import ResearchOutcome, ResearchPaused, ResearchRejected, ResearchService
from store.errors import StoreError
from store.owner import current_actor

if TYPE_CHECKING:
    from app.settings import SessionsConfig


@dataclass(frozen=True, slots=True)
class RunEnded:
    """The last item of a run's queue: its outcome, or the error that ended it."""

    outcome: ResearchOutcome | ResearchPaused | ResearchRejected | None
    error: BaseException | None


log = logging.getLogger(__name__)
_loop: asyncio.AbstractEventLoop | None = None
_loop_guard = threading.Lock()


class RunRefused(InputError):
    """A chat run over one of the caps; nothing was started or written, and the message says what to do."""


@dataclass(frozen=True, slots=True)
class RunLimits:
    """The caps on chat runs (`sessions` settings). Admins may go up to the UI's hard limits only."""

    per_person: int = 2
    total: int = 4
    user_wall_clock_s: float = 900.0
    user_tool_calls: int = 10
    admin_wall_clock_s: float = 3600.0
    admin_tool_calls: int = 50

    @classmethod
    def from_config(cls, cfg: SessionsConfig) -> RunLimits:
        return cls(per_person=cfg.max_runs_per_person, total=cfg.max_runs_total,
                   user_wall_clock_s=cfg.user_max_wall_clock_s, user_tool_calls=cfg.user_max_tool_calls)

    def wall_clock_s(self, admin: bool) -> float:
        """The longest time limit this person may give a run."""
        return self.admin_wall_clock_s if admin else min(self.user_wall_clock_s, self.admin_wall_clock_s)

    def tool_calls(self, admin: bool) -> int:
        """The largest tool-call budget this person may give a run."""
        return self.admin_tool_calls if admin else min(self.user_tool_calls, self.admin_tool_calls)

    def check_options(self, options: RunOptions | None, admin: bool, *, resumed: bool = False) -> None:
        """Refuse options over this person's limits (RunRefused, naming the limit); None has nothing to check.
        `resumed`: the options are a stored session's, which cannot be changed, so the message says what can."""
        if options is None:
            return
        who = "an admin's" if admin else "your"
        stored = "this session was started with it; ask the question again, or ask an admin to resume it"
        if options.wall_clock_s > self.wall_clock_s(admin):
            raise RunRefused(f"a time limit of {options.wall_clock_s:.0f} s is over {who} limit of "
                             f"{self.wall_clock_s(admin):.0f} s: "
                             + (stored if resumed else "lower the time limit in ⚙️ Research settings"))
        if options.max_tool_calls > self.tool_calls(admin):
            raise RunRefused(f"{options.max_tool_calls} tool calls is over {who} limit of {self.tool_calls(admin)}: "
                             + (stored if resumed else "lower Max tool calls in ⚙️ Research settings"))


_slots_guard = threading.Lock()
_running: dict[str, int] = {}  # person -> chat runs going now, in this process


def running_runs(person: str | None = None) -> int:
    """Chat runs going now in this process: one person's, or everyone's."""
    with _slots_guard:
        return _running.get(person, 0) if person is not None else sum(_running.values())


def _take_slot(person: str, limits: RunLimits) -> None:
    with _slots_guard:
        mine, total = _running.get(person, 0), sum(_running.values())
        if mine >= limits.per_person:
            raise RunRefused(f"you already have {mine} research run(s) going (the limit is {limits.per_person} at "
                             "once, including runs of pages you left): wait for one to finish, then ask again")
        if total >= limits.total:
            raise RunRefused(f"the server is busy: {total} research runs are going (the limit is {limits.total} at "
                             "once for everyone); try again in a few minutes")
        _running[person] = mine + 1


def _give_slot(person: str) -> None:
    with _slots_guard:
        left = _running.get(person, 0) - 1
        if left > 0:
            _running[person] = left
        else:
            _running.pop(person, None)


def _stored_options(service: ResearchService, session_id: str) -> RunOptions | None:
    """The options a resumed session goes on with: its own, as stored when it started (perhaps by MCP or the CLI,
    under other caps, or before this person's role or the caps changed). None when they cannot be read: the resume
    itself then refuses the session, before it runs."""
    try:
        return RunOptions.model_validate(service.log.get(session_id).options)
    except (StoreError, ValidationError):
        return None


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
                 resume: tuple[str, PlanDecision | ClarificationAnswer | None] | None = None,
                 limits: RunLimits | None = None, admin: bool = False, person: str | None = None) -> None:
        """Start the run (`approve_plan`: pause after the plan; `resume`: go on with a session, answering its paused
        plan or clarifying question if any; whether a question is asked first is the deployment's
        `sessions.clarify`). `on_event` (optional) is called on the loop's thread for every event, before the page
        sees it: it must be quick and thread-safe (the page uses it to file the session in its chat thread, so a
        page rerun mid-run loses nothing).

        The run counts against `limits` (default: the built-in caps) for `person` (default: the current actor);
        `admin` lifts the per-run option limits to the hard ones; a resume is held to them with the options the
        session was stored with. A run over a cap ends at once with RunRefused (nothing started or written)."""
        self._queue: queue.Queue[ev.Event | RunEnded] = queue.Queue()
        self.ended: RunEnded | None = None
        self._on_event = on_event
        self._future: Future[Any]
        limits = limits or RunLimits()
        self._person = person if person is not None else current_actor().owner
        try:
            if resume is None:
                limits.check_options(options, admin)
            else:  # a resume goes on with the session's stored options: they meet this person's caps too
                limits.check_options(_stored_options(service, resume[0]), admin, resumed=True)
            _take_slot(self._person, limits)
        except RunRefused as exc:
            self._future = Future()
            self._future.set_exception(exc)
            self._queue.put(RunEnded(None, exc))
            return
        work = service.resume(resume[0], resume[1], on_event=self._event) if resume is not None else service.start(
            question, options, on_event=self._event, tools=tools, source="chat", approve_plan=approve_plan)
        self._future = asyncio.run_coroutine_threadsafe(work, shared_loop())
        self._future.add_done_callback(self._done)

    def _event(self, event: ev.Event) -> None:
        if self._on_event is not None:
            try:
                self._on_event(event)
            except Exception:  # a page hook must never break the research itself
                log.exception("UI run hook failed for %s", type(event).__name__)
        self._queue.put(event)

    def _done(self, future: Future[Any]) -> None:
        _give_slot(self._person)  # the run has ended (however): its slot is free
        try:
            self._queue.put(RunEnded(future.result(), None))
        except BaseException as exc:  # noqa: BLE001 - handed to the page, which shows it
            self._queue.put(RunEnded(None, exc))

    def cancel(self) -> None:
        """Stop the run: its session is marked failed, as any run stopped midway, and its slot is free at once."""
        self._future.cancel()

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
