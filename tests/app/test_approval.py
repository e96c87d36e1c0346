"""Plan approval (issue 21) on the real service, session log and LangGraph checkpointer, with the scripted policy:
a paused plan survives a restart, accept changes nothing in the token sequence, an edit enters it as a forced span
beside the policy's own plan, a reject ends the session, bad edits leave it paused, a pause expires; approval off
behaves exactly as a run without checkpoints."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from agent.approval import ApprovalError, PlanDecision, approved_plan_text
from agent.config import AgentConfig
from app.durable import CHECKPOINT_FILE, DurableSessions, ResumeError
from app.service import ResearchOutcome, ResearchPaused, ResearchRejected, ResearchService, RunFailedError
from store.config import StoreConfig
from store.records import loss_mask
from store.session_log import SessionLog
from store.session_log.checkpoints import SessionRuns
from tests.agent.scripts import PLAN
from tests.app.resume_worker import OPTIONS, QUESTION, script
from tests.fakes import byte_ids

ROOT = Path(__file__).resolve().parents[2]


def service(data: Path, durable: bool = True, expiry_s: float = 3600.0) -> ResearchService:
    store = StoreConfig(data_dir=data)
    log = SessionLog.from_config(store)
    policy, search = script(None, data / "blocked")
    return ResearchService(policy, {"local_search": search}, log, AgentConfig(),
                           durable=DurableSessions.for_store(log, store, approval_expiry_s=expiry_s) if durable else None)


def pause(data: Path, **kw: object) -> tuple[ResearchService, str]:
    svc = service(data, **kw)  # type: ignore[arg-type]
    out = asyncio.run(svc.start(QUESTION, OPTIONS, approve_plan=True))
    assert isinstance(out, ResearchPaused)
    return svc, out.session_id


def test_a_paused_plan_survives_a_restart_and_accept_changes_nothing(tmp_path: Path) -> None:
    plain = asyncio.run(service(tmp_path / "plain", durable=False).run(QUESTION, OPTIONS))
    svc, sid = pause(tmp_path / "d")
    first = SessionRuns(svc.log).get(sid)
    assert first is not None and first.state == "awaiting_approval" and first.expires_at
    assert first.pause == {"plan_text": PLAN, "deep_analysis": "Simple retrieval.", "rubric": ["the language"],
                           "research_plan": "Step 1: search Haymo of Faversham."}
    assert svc.log.get(sid).status == "running" and len(svc.log.get(sid).trajectory.turns) == 1
    svc.log.close()

    again = service(tmp_path / "d")  # a new process: the pause is read back from the store and the checkpoint
    shown = asyncio.run(again.resume(sid))
    assert isinstance(shown, ResearchPaused) and shown.plan.rubric == ("the language",)
    done = asyncio.run(again.resume(sid, PlanDecision("accept")))
    assert isinstance(done, ResearchOutcome)
    rec = again.log.get(sid)
    assert rec.status == "completed"
    assert [(t.stage, t.kind, t.text) for t in rec.trajectory.turns] == [
        (t.stage, t.kind, t.text) for t in plain.trajectory.turns]
    assert rec.trajectory.token_ids == plain.trajectory.token_ids
    approval = SessionRuns(again.log).approval(sid)
    assert approval is not None and approval.action == "accept" and approval.user_rubrics == ()


def test_approval_off_is_the_same_run_as_without_checkpoints(tmp_path: Path) -> None:
    plain = asyncio.run(service(tmp_path / "plain", durable=False).run(QUESTION, OPTIONS))
    durable = asyncio.run(service(tmp_path / "d").run(QUESTION, OPTIONS))
    assert durable.trajectory.turns == plain.trajectory.turns and durable.report.markdown == plain.report.markdown


def test_an_edit_enters_as_a_forced_span_beside_the_policys_plan(tmp_path: Path) -> None:
    svc, sid = pause(tmp_path)
    decision = PlanDecision.parse({"action": "edit", "owner": "alice", "note": "Prefer primary sources.",
                                   "rubric": ["the language", "  who translated   them "]})
    out = asyncio.run(svc.resume(sid, decision))
    assert isinstance(out, ResearchOutcome)
    turns = svc.log.get(sid).trajectory.turns
    forced = approved_plan_text(decision)
    assert (turns[0].stage, turns[0].kind, turns[0].text) == ("plan", "sampled", PLAN)  # the policy's own plan
    assert (turns[1].stage, turns[1].kind, turns[1].text) == ("plan", "forced", forced)
    assert "- who translated them\n" in forced and "<research_plan>Prefer primary sources.</research_plan>" in forced
    assert sum(turns[1].mask) == 0 and sum(turns[0].mask) == len(turns[0].token_ids)  # no gradient on the user's plan
    text = "".join(t.text for t in turns)
    assert out.trajectory.token_ids == byte_ids(text) and len(loss_mask(turns)) == len(byte_ids(text))
    approval = SessionRuns(svc.log).approval(sid)
    assert approval is not None and (approval.action, approval.owner, approval.policy_plan) == ("edit", "alice", PLAN)
    assert approval.user_rubrics == ("the language", "who translated them")
    assert approval.approved["note"] == "Prefer primary sources."

    env = {k: v for k, v in os.environ.items() if not k.startswith("RUBRICEM_")} | {
        "RUBRICEM_STORE__DATA_DIR": str(tmp_path)}
    cli = subprocess.run([sys.executable, "-m", "app.cli", "sessions", "export", "--edited-plans"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=120, check=True)
    (row,) = [json.loads(line) for line in cli.stdout.splitlines()]
    assert row["session_id"] == sid and row["policy_plan"] == PLAN and row["owner"] == "alice"
    assert row["approved_plan"] == {"rubric": ["the language", "who translated them"], "note": "Prefer primary sources."}


def test_a_reject_ends_the_session_as_rejected_and_prunes_its_checkpoints(tmp_path: Path) -> None:
    svc, sid = pause(tmp_path)
    assert isinstance(asyncio.run(svc.resume(sid, PlanDecision("reject"))), ResearchRejected)
    rec, run = svc.log.get(sid), SessionRuns(svc.log).get(sid)
    assert rec.status == "failed" and rec.error == "the user rejected the plan"
    assert run is not None and run.state == "rejected"
    assert [t.stage for t in rec.trajectory.turns] == ["plan"]
    with sqlite3.connect(tmp_path / CHECKPOINT_FILE) as db:
        assert db.execute("SELECT COUNT(*) FROM checkpoints WHERE thread_id = ?", (sid,)).fetchone() == (0,)
    with pytest.raises(ResumeError, match="is failed"):
        asyncio.run(svc.resume(sid, PlanDecision("accept")))


@pytest.mark.parametrize(("answer", "message"), [
    ({"action": "edit", "rubric": []}, "at least one rubric item"),
    ({"action": "edit", "rubric": ["  ", ""], "note": "only a note"}, "at least one rubric item"),
    ({"action": "edit", "rubric": "one string"}, "a list of items"),
    ({"action": "edit", "rubric": ["<b>tag</b>"]}, "cannot contain < or >"),
    ({"action": "maybe"}, "unknown action"),
])
def test_a_bad_edit_is_refused_and_the_session_stays_paused(tmp_path: Path, answer: dict, message: str) -> None:  # type: ignore[type-arg]
    svc, sid = pause(tmp_path)
    with pytest.raises(ApprovalError, match=message):
        PlanDecision.parse(answer)
    # Through the CLI: refused before anything runs (exit 2), the session still waits.
    if answer.get("action") == "edit" and isinstance(answer.get("rubric"), list):
        args = [a for r in answer["rubric"] for a in ("--rubric", r)] + ["--note", answer.get("note", "n")]
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUBRICEM_")} | {
            "RUBRICEM_STORE__DATA_DIR": str(tmp_path)}
        cli = subprocess.run([sys.executable, "-m", "app.cli", "resume", sid, *args], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120, check=False)
        assert cli.returncode == 2 and message in cli.stderr
    run = SessionRuns(svc.log).get(sid)
    assert run is not None and run.state == "awaiting_approval" and svc.log.get(sid).status == "running"


def test_a_pause_expires(tmp_path: Path) -> None:
    svc, sid = pause(tmp_path, expiry_s=1e-6)
    with pytest.raises(RunFailedError, match="expired"):
        asyncio.run(svc.resume(sid, PlanDecision("accept")))
    run = SessionRuns(svc.log).get(sid)
    assert run is not None and run.state == "expired" and svc.log.get(sid).status == "failed"
    with sqlite3.connect(tmp_path / CHECKPOINT_FILE) as db:  # an expired session's checkpoints are pruned too
        assert db.execute("SELECT COUNT(*) FROM checkpoints WHERE thread_id = ?", (sid,)).fetchone() == (0,)


def test_on_postgresql_the_pause_and_checkpoints_live_in_the_stores_database(tmp_path: Path, postgres_url: str) -> None:
    import psycopg

    store = StoreConfig(data_dir=tmp_path, database_url=postgres_url)  # type: ignore[arg-type]
    log = SessionLog.from_config(store)
    policy, search = script(None, tmp_path / "blocked")
    svc = ResearchService(policy, {"local_search": search}, log, AgentConfig(),
                          durable=DurableSessions.for_store(log, store))
    assert svc.durable is not None and svc.durable.target.database_url == postgres_url
    paused = asyncio.run(svc.start(QUESTION, OPTIONS, approve_plan=True))
    assert isinstance(paused, ResearchPaused)
    sid = paused.session_id
    with psycopg.connect(postgres_url) as db:
        assert db.execute("SELECT COUNT(*) FROM checkpoints WHERE thread_id = %s", (sid,)).fetchone()[0] > 0  # type: ignore[index]
    done = asyncio.run(svc.resume(sid, PlanDecision.parse({"action": "edit", "rubric": ["the language"]})))
    assert isinstance(done, ResearchOutcome) and log.get(sid).status == "completed"
    assert [t.kind for t in log.get(sid).trajectory.turns[:2]] == ["sampled", "forced"]
    assert SessionRuns(log).approval(sid).user_rubrics == ("the language",)  # type: ignore[union-attr]
    with psycopg.connect(postgres_url) as db:  # pruned at the end
        assert db.execute("SELECT COUNT(*) FROM checkpoints WHERE thread_id = %s", (sid,)).fetchone()[0] == 0  # type: ignore[index]
    assert not (tmp_path / CHECKPOINT_FILE).exists()
    log.close()


def test_approval_without_checkpoints_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    from agent.errors import InputError

    svc = service(tmp_path, durable=False)
    with pytest.raises(InputError, match="plan approval needs durable sessions"):
        asyncio.run(svc.start(QUESTION, OPTIONS, approve_plan=True))
    assert svc.log.list_sessions() == []


def test_deleting_a_persons_data_deletes_their_paused_sessions_checkpoints(tmp_path: Path) -> None:
    """A paused plan's checkpoint holds the person's question and plan outside the store's tables: `rubricem users
    delete-data` purges it before the rows go (issue 18 × 21), and leaves another person's checkpoint alone."""
    from store.owner import acting_as

    data = tmp_path / "d"
    with acting_as("alice"):
        svc, alice_sid = pause(data)
    svc.log.close()
    with acting_as("bob"):
        svc, bob_sid = pause(data)
    svc.log.close()

    def threads() -> set[str]:
        with sqlite3.connect(data / CHECKPOINT_FILE) as conn:
            return {r[0] for r in conn.execute("SELECT DISTINCT thread_id FROM checkpoints")}

    assert {alice_sid, bob_sid} <= threads()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUBRICEM_")}
    env.update({"RUBRICEM_STORE__DATA_DIR": str(data), "HF_HUB_OFFLINE": "1"})
    out = subprocess.run([sys.executable, "-m", "app.cli", "users", "delete-data", "alice", "--yes"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    left = threads()
    assert alice_sid not in left and bob_sid in left
    with SessionLog.from_config(StoreConfig(data_dir=data)) as log:
        assert [s.session_id for s in log.list_sessions(limit=10)] == [bob_sid]
