"""Durable sessions (issue 21): a research process killed with SIGKILL inside the Research loop and inside a tool
call is resumed from its checkpoint; the log then holds each turn exactly once, the token sequence is one
contiguous valid sequence (the same as an uninterrupted run's), and the report completes. Bad resumes change
nothing; a missing or corrupt checkpoint ends the session with the reason. A session another live process runs is
never taken over (issue 34: its lease is renewed by a heartbeat), and one whose process is gone shows as interrupted.

Real parts: real processes (tests/app/resume_worker.py), the real service, SQLite session log and LangGraph SQLite
checkpointer; the scripted policy gives exact outputs (its byte tokenizer makes "contiguous" checkable exactly).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.approval import PlanDecision
from agent.config import AgentConfig
from app.durable import CHECKPOINT_FILE, DurableSessions, ResumeError
from app.scheduler import build_scheduler, sweep
from app.service import ResearchPaused, ResearchService, RunFailedError
from app.settings import Settings
from store.config import StoreConfig
from store.errors import SessionNotFound
from store.session_log import LeaseSweep, SessionLog
from store.session_log.checkpoints import SessionRuns
from tests.app.resume_worker import LEASE, OPTIONS, QUESTION, script
from tests.fakes import byte_ids

ROOT = Path(__file__).resolve().parents[2]


def worker(data: Path, mode: str, block: str | None = None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUBRICEM_")} | {"PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "tests.app.resume_worker", str(data), mode, *([block] if block else [])],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def kill_when_blocked(proc: subprocess.Popen[str], marker: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not marker.exists():
        assert proc.poll() is None, f"the worker exited early: {proc.communicate()}"
        assert time.monotonic() < deadline, "the worker never reached the blocking point"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    marker.unlink()
    time.sleep(LEASE.lease_s + 0.5)  # the killed process's lease runs out: only then may another take it over


def finish(proc: subprocess.Popen[str]) -> dict[str, str]:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def log_of(data: Path) -> SessionLog:
    return SessionLog.from_config(StoreConfig(data_dir=data))


@pytest.mark.slow
def test_killed_in_research_and_in_a_tool_call_then_resumed_holds_each_turn_once(tmp_path: Path) -> None:
    reference_dir, data = tmp_path / "reference", tmp_path / "killed"
    reference_dir.mkdir(), data.mkdir()
    reference = finish(worker(reference_dir, "start"))  # the same session, never interrupted

    kill_when_blocked(worker(data, "start", "research"), data / "blocked")
    with log_of(data) as log:
        (sid,) = [s.session_id for s in log.list_sessions()]
        cut = log.get(sid)
        assert cut.status == "running"
        # Killed while the model wrote its first query: the graph's forced `<call_tool ...>` opening is in the log
        # but in no checkpoint (the research node never finished).
        assert [t.kind for t in cut.trajectory.turns] == ["sampled", "forced"]
        assert SessionRuns(log).get(sid).state == "active"  # type: ignore[union-attr]

    kill_when_blocked(worker(data, "resume", "tool"), data / "blocked")  # the resumed run is killed in tool call 2
    with log_of(data) as log:
        cut = log.get(sid).trajectory
        assert len(cut.tool_calls) == 1 and cut.turns[-1].text.endswith("</call_tool>")

    result = finish(worker(data, "resume"))
    assert result["session_id"] == sid
    with log_of(data) as log, log_of(reference_dir) as ref_log:
        rec = log.get(sid)
        ref = ref_log.get(reference["session_id"])
        assert rec.status == "completed" and rec.report == ref.report == result["report"] == reference["report"]
        traj = rec.trajectory
        # Each turn exactly once, in order: the same turns as the uninterrupted run's.
        assert [(t.stage, t.kind, t.text) for t in traj.turns] == [
            (t.stage, t.kind, t.text) for t in ref.trajectory.turns]
        assert [c.query for c in traj.tool_calls] == [c.query for c in ref.trajectory.tool_calls]
        assert len(traj.tool_calls) == 2
        # One contiguous valid training sequence: the ids are exactly the byte tokens of the text, end to end.
        text = "".join(t.text for t in traj.turns)
        assert traj.token_ids == byte_ids(text) == ref.trajectory.token_ids
        assert text.count("<structured_plan>") == 1 and text.count("<tool_output>") == 2
        assert text.count('<call_tool name="local_search">Haymo of Faversham</call_tool>') == 1
        assert SessionRuns(log).get(sid).state == "finished"  # type: ignore[union-attr]
    # Pruned on session end: no checkpoint of the thread is left.
    with sqlite3.connect(data / CHECKPOINT_FILE) as db:
        assert db.execute("SELECT COUNT(*) FROM checkpoints WHERE thread_id = ?", (sid,)).fetchone() == (0,)


def rubricem(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI, on this data folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUBRICEM_")} | {
        "PYTHONPATH": str(ROOT), "RUBRICEM_STORE__DATA_DIR": str(data)}
    return subprocess.run([sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main())", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_resume_refuses_a_session_another_live_process_runs_then_goes_on_once_that_process_is_gone(
        tmp_path: Path) -> None:
    proc = worker(tmp_path, "start", "tool")  # a real process, hanging inside its second tool call
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "blocked").exists():
            assert proc.poll() is None, f"the worker exited early: {proc.communicate()}"
            assert time.monotonic() < deadline, "the worker never reached the blocking point"
            time.sleep(0.05)
        time.sleep(LEASE.lease_s + 1)  # longer than one lease: only the worker's heartbeat keeps it live
        with log_of(tmp_path) as log:
            (sid,) = [s.session_id for s in log.list_sessions()]
            before = log.get(sid)
            (row,) = log.list_sessions()
            assert row.status == "running" and row.shown_status == "running"

        svc, log = service(tmp_path)  # the service refuses (the CLI's precheck below is not the only guard)
        with pytest.raises(ResumeError, match="is running in another process"):
            asyncio.run(svc.resume(sid))
        assert log.get(sid) == before and SessionRuns(log).get(sid).state == "active"  # type: ignore[union-attr]
        assert log.sweep_expired_leases().interrupted == ()  # the sweep leaves a live session alone

        cli = rubricem(tmp_path, "resume", sid, "--quiet")
        assert cli.returncode == 2, cli.stderr
        assert f"session {sid} is running in another process (last heartbeat" in cli.stderr
        assert "wait for it to finish" in cli.stderr
        assert log.get(sid) == before  # nothing changed
        log.close()
        assert proc.poll() is None  # the worker still runs, untouched
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)

    time.sleep(LEASE.lease_s + 0.5)  # the process is gone: its lease expires
    with log_of(tmp_path) as log:
        (row,) = log.list_sessions()
        assert row.status == "running" and row.interrupted and row.shown_status == "interrupted"
        assert log.sweep_expired_leases().interrupted == (sid,)  # checkpointed: resumable, not failed
        assert log.get(sid).status == "running"
    listed = rubricem(tmp_path, "sessions", "list")
    assert listed.returncode == 0 and "interrupted" in listed.stdout, listed.stdout + listed.stderr
    result = finish(worker(tmp_path, "resume"))
    assert result["session_id"] == sid
    with log_of(tmp_path) as log:
        assert log.get(sid).status == "completed" and not log.list_sessions()[0].interrupted


def test_the_crash_sweep_fails_a_session_that_was_not_checkpointed(tmp_path: Path) -> None:
    store = StoreConfig(data_dir=tmp_path)
    with SessionLog.from_config(store) as log:
        policy, search = script(None, tmp_path / "blocked")
        plain = ResearchService(policy, {"local_search": search}, log, AgentConfig())  # no checkpoints
        done = asyncio.run(plain.run(QUESTION, OPTIONS))
        # A process killed mid-run: its session stays running and its lease lapses (written as a dead process would
        # have left it; the running session itself comes from the real service).
        sid = log.create_session(QUESTION, log.get(done.session_id).trajectory.prompt, {}, "v0")
        assert log.sweep_expired_leases().failed == ()  # its lease is still live
        with log.transaction(write=True) as conn:
            conn.execute("UPDATE sessions SET lease_until = heartbeat_at WHERE session_id = ?", (sid,))
        assert log.list_sessions()[0].shown_status == "running"  # not checkpointed: never offered for resume
        settings = Settings(store=store)
        assert build_scheduler(settings, blocking=False).get_job("sweep") is not None  # swept from its start on
        sweep(settings)  # the scheduler's sweep (process starts sweep the same way, in app.container.build)
        assert log.sweep_expired_leases() == LeaseSweep((), ())  # nothing left to sweep
        rec = log.get(sid)
        assert rec.status == "failed" and "was not checkpointed, so it cannot be resumed" in (rec.error or "")
        assert log.get(done.session_id).status == "completed"  # finished sessions are never touched


def service(data: Path) -> tuple[ResearchService, SessionLog]:
    store = StoreConfig(data_dir=data)
    log = SessionLog.from_config(store)
    policy, search = script(None, data / "blocked")
    return ResearchService(policy, {"local_search": search}, log, AgentConfig(),
                           durable=DurableSessions.for_store(log, store)), log


def paused(data: Path) -> tuple[ResearchService, SessionLog, str]:
    svc, log = service(data)
    out = asyncio.run(svc.start(QUESTION, OPTIONS, approve_plan=True))
    assert isinstance(out, ResearchPaused)
    return svc, log, out.session_id


def test_resuming_an_unknown_or_finished_session_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    svc, log = service(tmp_path)
    with pytest.raises(SessionNotFound):
        asyncio.run(svc.resume("no-such-session"))
    done = asyncio.run(svc.run(QUESTION, OPTIONS))
    before = log.get(done.session_id)
    with pytest.raises(ResumeError, match="is completed: only an unfinished session can be resumed"):
        asyncio.run(svc.resume(done.session_id))
    assert log.get(done.session_id) == before


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_a_missing_or_corrupt_checkpoint_marks_the_session_interrupted(tmp_path: Path, damage: str) -> None:
    svc, log, sid = paused(tmp_path)
    with sqlite3.connect(tmp_path / CHECKPOINT_FILE) as db:
        if damage == "missing":
            db.execute("DELETE FROM checkpoints WHERE thread_id = ?", (sid,))
            db.execute("DELETE FROM writes WHERE thread_id = ?", (sid,))
        else:
            db.execute("UPDATE checkpoints SET checkpoint = ? WHERE thread_id = ?", (b"\xc1not msgpack", sid))
    with pytest.raises(RunFailedError) as err:
        asyncio.run(svc.resume(sid, PlanDecision("accept")))
    reason = {"missing": "no checkpoint for session", "corrupt": "the checkpoint could not be read"}[damage]
    assert reason in str(err.value)
    rec, run = log.get(sid), SessionRuns(log).get(sid)
    assert rec.status == "failed" and reason in (rec.error or "")
    assert run is not None and run.state == "interrupted" and reason in (run.reason or "")


def test_a_run_whose_session_another_process_took_over_stops_without_writing(tmp_path: Path) -> None:
    """The write fence (issue 34): this process's lease lapses while it lives (here: its clock jumps past the lease,
    as for a process frozen or cut off from the store longer than that), another process resumes the session, and
    this run then writes nothing more: no turn, no failure mark, no pruned checkpoint or ended run state."""
    from datetime import UTC, datetime, timedelta

    from app.durable import LeaseTiming
    from tests.fakes import ScriptedPolicy

    class Clock:
        def __init__(self) -> None:
            self.now = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)

        def __call__(self) -> datetime:
            self.now += timedelta(microseconds=1)
            return self.now

    clock, store = Clock(), StoreConfig(data_dir=tmp_path)
    log = SessionLog.from_config(store, clock=clock)
    policy, search = script(None, tmp_path / "blocked")
    inner = policy.script
    taken: list[int] = []

    def say(context: str, stop: list[str]) -> str:
        text = inner(context, stop)
        if "</call_tool>" in stop and context.count("</tool_output>") == 2 and not taken:
            # Another process, finding the lease lapsed, takes the session over (what `rubricem resume` does).
            (sid,) = [s.session_id for s in log.list_sessions()]
            taken.append(len(log.get(sid).trajectory.turns))
            clock.now += timedelta(seconds=61)
            other = SessionRuns(SessionLog.from_config(store, clock=clock))
            assert other.claim(other.get(sid), lease_s=600, owner="other-host:2:y")  # type: ignore[arg-type]
        return text

    policy.script = say
    service = ResearchService(policy, {"local_search": search}, log, AgentConfig(),
                              durable=DurableSessions.for_store(log, store),
                              lease=LeaseTiming(heartbeat_s=50.0, lease_s=60.0))  # no real-time beat in the test
    with pytest.raises(RunFailedError, match="taken over by another process"):
        asyncio.run(service.start(QUESTION, OPTIONS))
    (sid,) = [s.session_id for s in log.list_sessions()]
    record = log.get(sid)
    assert taken and len(record.trajectory.turns) == taken[0]  # the turn sampled after the takeover was not written
    assert record.status == "running" and record.error is None  # not marked failed under the other's lease
    assert log.lease(sid).owner == "other-host:2:y"
    run = SessionRuns(log).get(sid)
    assert run is not None and run.state == "active"  # its run state and checkpoints are the other process's now
    with sqlite3.connect(tmp_path / CHECKPOINT_FILE) as cp:
        assert cp.execute("SELECT count(*) FROM checkpoints WHERE thread_id = ?", (sid,)).fetchone()[0] > 0
