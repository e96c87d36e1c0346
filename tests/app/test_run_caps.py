"""Caps on chat runs (issue 34): runs going at once per person and in total, and the time limit and tool-call budget
a non-admin may give one run, enforced where every chat run starts (`app.ui.runner.LiveRun`), not in the widgets. A
refused run starts nothing and writes nothing; the message names the limit and what to do.

Real parts: the real ResearchService and SQLite session log on the UI's shared event loop; the scripted policy of the
resume tests, which hangs while the model writes its first query, so the runs stay going until cancelled.
"""

from __future__ import annotations

import time
from pathlib import Path

from agent.config import AgentConfig
from app.service import ResearchService
from app.settings import SessionsConfig
from app.ui.runner import LiveRun, RunEnded, RunLimits, RunRefused, running_runs
from store.config import StoreConfig
from store.session_log import SessionLog
from tests.app.resume_worker import OPTIONS, QUESTION, script


def hanging_service(data: Path) -> tuple[ResearchService, SessionLog]:
    log = SessionLog.from_config(StoreConfig(data_dir=data))
    policy, search = script("research", data / "blocked")
    return ResearchService(policy, {"local_search": search}, log, AgentConfig()), log


def refusal(run: LiveRun) -> BaseException | None:
    for _ in run.events(poll_s=0.05):
        break
    assert run.ended is not None and not run.running, "the run was not refused"
    assert isinstance(run.ended, RunEnded)
    return run.ended.error


def wait_sessions(log: SessionLog, n: int) -> None:
    deadline = time.monotonic() + 60
    while len(log.list_sessions()) < n:
        assert time.monotonic() < deadline, "the runs never created their sessions"
        time.sleep(0.05)


def test_concurrent_runs_are_capped_per_person_and_in_total(tmp_path: Path) -> None:
    svc, log = hanging_service(tmp_path)
    limits = RunLimits.from_config(SessionsConfig(max_runs_per_person=1, max_runs_total=2))
    going: list[LiveRun] = []
    try:
        going.append(LiveRun(svc, QUESTION, OPTIONS, limits=limits, person="alice"))
        wait_sessions(log, 1)
        assert going[0].running and running_runs("alice") == 1

        again = LiveRun(svc, QUESTION, OPTIONS, limits=limits, person="alice")  # the page was left, she asks again
        error = refusal(again)
        assert isinstance(error, RunRefused)
        assert "you already have 1 research run(s) going (the limit is 1 at once" in str(error)
        assert "wait for one to finish" in str(error)

        going.append(LiveRun(svc, QUESTION, OPTIONS, limits=limits, person="bob"))
        wait_sessions(log, 2)
        error = refusal(LiveRun(svc, QUESTION, OPTIONS, limits=limits, person="carol"))
        assert isinstance(error, RunRefused) and "the server is busy: 2 research runs are going" in str(error)
        assert "try again in a few minutes" in str(error)
        time.sleep(0.5)
        assert len(log.list_sessions()) == 2  # the refused runs wrote nothing

        going.pop(0).cancel()  # alice's run ends: her slot is free again
        assert running_runs("alice") == 0
        going.append(LiveRun(svc, QUESTION, OPTIONS, limits=limits, person="alice"))
        wait_sessions(log, 3)
        assert going[-1].running
    finally:
        for run in going:
            run.cancel()
    assert running_runs() == 0


def test_a_non_admin_cannot_ask_for_a_longer_or_bigger_run_than_the_limits(tmp_path: Path) -> None:
    svc, log = hanging_service(tmp_path)
    limits = RunLimits.from_config(SessionsConfig(user_max_wall_clock_s=900, user_max_tool_calls=10))
    long_run = OPTIONS.model_copy(update={"wall_clock_s": 3600.0})
    error = refusal(LiveRun(svc, QUESTION, long_run, limits=limits, person="mallory"))
    assert isinstance(error, RunRefused)
    assert str(error) == ("a time limit of 3600 s is over your limit of 900 s: lower the time limit in "
                          "⚙️ Research settings")
    many_calls = OPTIONS.model_copy(update={"max_tool_calls": 20})
    error = refusal(LiveRun(svc, QUESTION, many_calls, limits=limits, person="mallory"))
    assert isinstance(error, RunRefused) and "20 tool calls is over your limit of 10" in str(error)
    time.sleep(0.5)
    assert log.list_sessions() == []  # the refused runs wrote nothing
    plain = LiveRun(svc, QUESTION, OPTIONS)  # no person or limits given: the built-in caps, and it is within them
    try:
        wait_sessions(log, 1)
        assert plain.running
    finally:
        plain.cancel()

    admin = LiveRun(svc, QUESTION, long_run, limits=limits, person="root", admin=True)  # admins: up to 3600 s
    try:
        wait_sessions(log, 2)
        assert admin.running
        too_long = OPTIONS.model_copy(update={"wall_clock_s": 7200.0})
        error = refusal(LiveRun(svc, QUESTION, too_long, limits=limits, person="root2", admin=True))
        assert isinstance(error, RunRefused) and "over an admin's limit of 3600 s" in str(error)
    finally:
        admin.cancel()
