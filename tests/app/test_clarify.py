"""Clarification before planning (issue 21) on the real service, session log, graph and LangGraph checkpointer, with
the scripted policy: an ambiguous request pauses with one question (surviving a restart), the answer joins the user
message Plan sees and is recorded with the session; a clear request or unreadable decision output never pauses;
batch never asks; an expired pause cannot be answered from any path; a second concurrent resume is refused."""

from __future__ import annotations

import argparse
import asyncio
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from agent.approval import PlanDecision
from agent.prompts import prompt_sha
from agent.clarify import DECISION_STOPS, ClarificationAnswer, ClarifyDecision, clarification_block
from agent.config import AgentConfig
from agent.errors import InputError
from app.durable import DurableSessions, ResumeError, clarify_default, end_if_expired
from app.service import ResearchOutcome, ResearchPaused, ResearchService, RunFailedError
from store.config import StoreConfig
from store.session_log import SessionLog
from store.session_log.checkpoints import SessionRuns
from tests.app.resume_worker import OPTIONS, QUESTION, script
from tests.fakes import byte_ids

ASK = "ASK: Which Haymo do you mean, the friar of Faversham?"
QUESTION_ASKED = "Which Haymo do you mean, the friar of Faversham?"
ANSWER = "Yes, the Franciscan who died in 1244."


class Recorded:
    """What the scripted policy saw: the decision calls and the contexts the plan was sampled from."""

    def __init__(self) -> None:
        self.decisions: list[str] = []
        self.plans: list[str] = []


def service(data: Path, decision: str = ASK, *, clarify: bool = True, expiry_s: float = 3600.0,
            durable: bool = True, seen: Recorded | None = None) -> ResearchService:
    store = StoreConfig(data_dir=data)
    log = SessionLog.from_config(store)
    policy, search = script(None, data / "blocked")
    inner, seen = policy.script, seen if seen is not None else Recorded()

    def say(context: str, stop: Sequence[str]) -> str:
        if tuple(stop) == DECISION_STOPS:
            seen.decisions.append(context)
            return decision
        if "</structured_plan>" in stop:
            seen.plans.append(context)
        return inner(context, stop)

    policy.script = say
    runs = DurableSessions.for_store(log, store, approval_expiry_s=expiry_s, clarify=clarify) if durable else None
    return ResearchService(policy, {"local_search": search}, log, AgentConfig(), durable=runs)


def test_an_ambiguous_request_pauses_and_the_answer_reaches_the_plan_and_the_session(tmp_path: Path) -> None:
    plain = asyncio.run(service(tmp_path / "plain", durable=False).run(QUESTION, OPTIONS))
    svc = service(tmp_path / "d")
    paused = asyncio.run(svc.start(QUESTION, OPTIONS, source="cli"))
    assert isinstance(paused, ResearchPaused) and paused.question == QUESTION_ASKED and paused.expires_at
    sid = paused.session_id
    run = SessionRuns(svc.log).get(sid)
    assert run is not None and run.state == "awaiting_approval" and run.pause_kind == "clarification"
    assert run.pause == {"kind": "clarification", "question": QUESTION_ASKED}
    assert svc.log.get(sid).trajectory.turns == ()  # paused before the plan: nothing sampled yet
    svc.log.close()

    seen = Recorded()
    again = service(tmp_path / "d", seen=seen)  # a new process: the pause is read back from the store
    shown = asyncio.run(again.resume(sid))
    assert isinstance(shown, ResearchPaused) and shown.question == QUESTION_ASKED
    with pytest.raises(ResumeError, match="clarifying question, not a plan decision"):
        asyncio.run(again.resume(sid, PlanDecision("accept")))
    done = asyncio.run(again.resume(sid, ClarificationAnswer(ANSWER, owner="alice")))
    assert isinstance(done, ResearchOutcome)
    assert seen.decisions == []  # the decision is in the checkpoint: a resume never asks the policy again

    block = clarification_block(QUESTION_ASKED, ANSWER)
    assert block == f"Clarification: {QUESTION_ASKED}\nThe user's answer: {ANSWER}"
    (plan_context,) = seen.plans
    assert f"{QUESTION}\n\n{block}" in plan_context.split("<|im_start|>assistant\n")[0]  # in the user message

    rec = again.log.get(sid)
    assert rec.status == "completed"
    prompt = rec.trajectory.prompt
    assert block in prompt.text and prompt.token_ids == byte_ids(prompt.text)
    assert prompt.prompt_sha != plain.trajectory.prompt.prompt_sha
    assert {t.prompt_sha for t in rec.trajectory.turns} == {prompt.prompt_sha}
    assert done.trajectory.prompt == prompt
    # The clarification is not part of the trajectory: the same turns as a run without it.
    assert [(t.stage, t.kind, t.text) for t in rec.trajectory.turns] == [
        (t.stage, t.kind, t.text) for t in plain.trajectory.turns]
    assert rec.metrics["clarification"] == {
        "status": "answered", "question": QUESTION_ASKED, "answer": ANSWER, "owner": "alice", "raw": ASK,
        "prompt_sha": prompt.prompt_sha, "decision_prompt_sha": prompt_sha(["clarify"])}
    state = SessionRuns(again.log).get(sid)
    assert state is not None and state.state == "finished"


@pytest.mark.parametrize(("decision", "status"), [("CLEAR", "clear"), ("I think this is fine?", "malformed"),
                                                  ("ASK:", "malformed"), ("", "malformed")])
def test_a_clear_or_unreadable_decision_never_pauses_and_is_recorded(tmp_path: Path, decision: str,
                                                                      status: str) -> None:
    plain = asyncio.run(service(tmp_path / "plain", durable=False).run(QUESTION, OPTIONS))
    seen = Recorded()
    out = asyncio.run(service(tmp_path / "d", decision, seen=seen).start(QUESTION, OPTIONS, source="cli"))
    assert isinstance(out, ResearchOutcome) and len(seen.decisions) == 1
    assert out.trajectory.prompt == plain.trajectory.prompt and out.trajectory.turns == plain.trajectory.turns
    rec = SessionLog.from_config(StoreConfig(data_dir=tmp_path / "d")).get(out.session_id)
    assert rec.metrics["clarification"] == {"status": status, "question": "", "answer": "", "raw": decision,
                                            "decision_prompt_sha": prompt_sha(["clarify"])}


def test_an_empty_answer_goes_on_without_clarification(tmp_path: Path) -> None:
    svc = service(tmp_path)
    paused = asyncio.run(svc.start(QUESTION, OPTIONS))
    assert isinstance(paused, ResearchPaused)
    done = asyncio.run(svc.resume(paused.session_id, ClarificationAnswer.parse("   ")))
    assert isinstance(done, ResearchOutcome)
    rec = svc.log.get(paused.session_id)
    assert "Clarification:" not in rec.trajectory.prompt.text
    assert rec.metrics["clarification"]["status"] == "skipped"


def test_batch_and_run_never_ask_even_when_the_setting_is_on(tmp_path: Path) -> None:
    from app.batch import BatchItem, run_batch

    seen = Recorded()
    svc = service(tmp_path, seen=seen)  # clarification on for interactive sessions
    assert isinstance(asyncio.run(svc.run(QUESTION, OPTIONS)), ResearchOutcome)
    summary = asyncio.run(run_batch(svc, [BatchItem("q1", QUESTION)], tmp_path / "out", options=OPTIONS))
    assert seen.decisions == [] and summary.done == 1
    assert all(r.state == "finished" for r in (SessionRuns(svc.log).get(s.session_id)
                                               for s in svc.log.list_sessions()) if r is not None)
    off = Recorded()
    out = asyncio.run(service(tmp_path / "off", clarify=False, seen=off).start(QUESTION, OPTIONS))
    assert isinstance(out, ResearchOutcome) and off.decisions == []


def test_clarification_defaults_and_needs_durable_sessions(tmp_path: Path) -> None:
    assert clarify_default("auto", "vllm") and clarify_default("auto", "llamacpp")
    assert not clarify_default("auto", "embedded")
    assert clarify_default("on", "embedded") and not clarify_default("off", "vllm")
    svc = service(tmp_path, durable=False)
    with pytest.raises(InputError, match="clarification needs durable sessions"):
        asyncio.run(svc.start(QUESTION, OPTIONS, clarify=True))
    assert svc.log.list_sessions() == []


def test_the_decision_parser() -> None:
    assert ClarifyDecision.parse("ASK: <b>Which</b> one?\nmore").question == "Which one?"
    assert ClarifyDecision.parse("**ASK**: which year?").status == "asked"
    assert ClarifyDecision.parse("clear - nothing to ask").status == "clear"
    assert ClarifyDecision.parse("ASK: " + "x" * 400).status == "malformed"
    assert ClarifyDecision.parse("Sure! ASK: which?").status == "malformed"
    assert ClarifyDecision.parse("ASK: which of the two fri", cut=True).status == "malformed"  # the cap cut it
    assert ClarifyDecision.parse("ASK: which one?\nblah bl", cut=True).question == "which one?"


def test_an_expired_question_cannot_be_answered_from_any_path(tmp_path: Path) -> None:
    from app.cli.resume import _precheck
    from app.settings import Settings

    svc = service(tmp_path, expiry_s=1e-6)
    paused = asyncio.run(svc.start(QUESTION, OPTIONS))
    assert isinstance(paused, ResearchPaused)
    sid = paused.session_id
    runs = SessionRuns(svc.log)
    assert runs.waiting() == [] and [r.session_id for r in runs.waiting(include_expired=True)] == [sid]
    # The CLI ends it before loading the model (what the UI's form does too, through the same helper).
    with pytest.raises(RunFailedError, match="clarifying question waited for an answer past .* and expired"):
        _precheck(Settings(store=StoreConfig(data_dir=tmp_path)), sid)
    run, rec = runs.get(sid), svc.log.get(sid)
    assert run is not None and run.state == "expired" and "clarifying question" in (run.reason or "")
    assert rec.status == "failed" and rec.error == run.reason
    with pytest.raises(ResumeError, match="is failed"):
        asyncio.run(svc.resume(sid, ClarificationAnswer(ANSWER)))

    other = service(tmp_path / "ui", expiry_s=1e-6)
    sid2 = asyncio.run(other.start(QUESTION, OPTIONS)).session_id
    assert other.durable is not None
    reason = end_if_expired(other.log, other.durable, SessionRuns(other.log).get(sid2))
    assert reason is not None and SessionRuns(other.log).get(sid2).state == "expired"  # type: ignore[union-attr]
    with pytest.raises(ResumeError, match="is failed"):
        asyncio.run(other.resume(sid2))


def test_a_plan_pause_expires_on_the_cli_path_before_the_model_loads(tmp_path: Path) -> None:
    from app.cli.resume import _precheck
    from app.settings import Settings

    svc = service(tmp_path, clarify=False, expiry_s=1e-6)
    paused = asyncio.run(svc.start(QUESTION, OPTIONS, approve_plan=True))
    assert isinstance(paused, ResearchPaused) and paused.question is None
    with pytest.raises(RunFailedError, match="the plan waited for approval past"):
        _precheck(Settings(store=StoreConfig(data_dir=tmp_path)), paused.session_id)
    run = SessionRuns(svc.log).get(paused.session_id)
    assert run is not None and run.state == "expired" and svc.log.get(paused.session_id).status == "failed"


def test_a_second_concurrent_resume_is_refused(tmp_path: Path) -> None:
    svc = service(tmp_path, clarify=False)
    paused = asyncio.run(svc.start(QUESTION, OPTIONS, approve_plan=True))
    assert isinstance(paused, ResearchPaused)
    sid = paused.session_id
    runs = SessionRuns(svc.log)
    seen = runs.get(sid)
    assert seen is not None
    # The store's compare-and-set: of two resumers that read the same row, only the first takes it over.
    assert runs.claim(seen) is True
    assert runs.claim(seen) is False
    runs.set_state(sid, "awaiting_approval", pause=seen.pause, expires_at=seen.expires_at)

    # Through the service: two resumers race on the same paused session (two services, two threads). No luck: the
    # test holds the database's write lock while both start, so both read the paused row and then queue on the lock
    # inside `claim` (seen on their stacks); only then is the lock released. Exactly one runs it to the end; the
    # other is refused for the race itself (never "not waiting", which a resume after the first one ended would get)
    # and changes nothing.
    import sqlite3
    import sys
    import threading
    import time

    def in_claim(thread: threading.Thread) -> bool:
        frame = sys._current_frames().get(thread.ident or -1)
        while frame is not None:
            if frame.f_code.co_name == "claim" and frame.f_code.co_filename.endswith("checkpoints.py"):
                return True
            frame = frame.f_back
        return False

    racers = [service(tmp_path, clarify=False), service(tmp_path, clarify=False)]
    results: list[object] = [None] * len(racers)

    def race(i: int) -> None:
        try:
            results[i] = asyncio.run(racers[i].resume(sid, PlanDecision("accept")))
        except ResumeError as exc:
            results[i] = exc

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(racers))]
    assert svc.log.path is not None
    blocker = sqlite3.connect(svc.log.path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while not all(in_claim(t) for t in threads):  # polling an observable state, not sleeping on a guess
            assert time.monotonic() < deadline, "the two resumers never both reached the claim"
            assert all(t.is_alive() for t in threads), results
            time.sleep(0.01)
    finally:
        blocker.execute("COMMIT")
        blocker.close()
    for t in threads:
        t.join(timeout=120)
    done = [r for r in results if isinstance(r, ResearchOutcome)]
    refused = [r for r in results if isinstance(r, ResumeError)]
    assert len(done) == 1 and len(refused) == 1, results
    assert re.search(r"already being resumed by another request|is running in another process", str(refused[0])), \
        refused[0]
    assert svc.log.get(sid).status == "completed"
    # Each turn once: the same turns as one uncontested pause-and-accept of the same scripted session.
    solo = service(tmp_path / "solo", clarify=False)
    alone = asyncio.run(solo.start(QUESTION, OPTIONS, approve_plan=True))
    assert isinstance(alone, ResearchPaused)
    asyncio.run(solo.resume(alone.session_id, PlanDecision("accept")))
    turns = [(t.stage, t.kind, t.text) for t in svc.log.get(sid).trajectory.turns]
    assert turns == [(t.stage, t.kind, t.text) for t in solo.log.get(alone.session_id).trajectory.turns]


def test_the_terminal_round_trip(tmp_path: Path) -> None:
    """`rubricem ask` in the terminal (app/cli_resume.drive): the question is shown, a bad answer is refused, the
    answer goes on to the report; `--answer` and `--clarify/--no-clarify` parse."""
    from app import cli
    from app.cli import resume as cli_resume

    svc = service(tmp_path)
    answers = iter(["x" * 2001, ANSWER])
    shown: list[str] = []

    def ask(prompt: str) -> str:
        shown.append(prompt)
        return next(answers)

    outcome = asyncio.run(cli_resume.drive(svc.start(QUESTION, OPTIONS, source="cli"),
                                           lambda sid, d: svc.resume(sid, d), ask))
    assert isinstance(outcome, ResearchOutcome) and len(shown) == 2
    assert clarification_block(QUESTION_ASKED, ANSWER) in svc.log.get(outcome.session_id).trajectory.prompt.text

    parser = cli.parser()
    assert parser.parse_args(["ask", "q", "--clarify"]).clarify is True
    assert parser.parse_args(["ask", "q", "--no-clarify"]).clarify is False
    assert parser.parse_args(["ask", "q"]).clarify is None
    args = parser.parse_args(["resume", "s1", "--answer", " the friar "])
    assert cli_resume.decision_from_args(args) == ClarificationAnswer("the friar")
    with pytest.raises(ValueError, match="give one of"):
        cli_resume.decision_from_args(argparse.Namespace(accept=True, reject=False, rubric=None, note=None,
                                                         answer="x"))

    def closed(prompt: str) -> str:
        raise EOFError("stdin closed")

    # Nobody to answer (stdin closed): the run goes on without clarification.
    eof = service(tmp_path / "eof")
    done = asyncio.run(cli_resume.drive(eof.start(QUESTION, OPTIONS, source="cli"),
                                        lambda sid, d: eof.resume(sid, d), closed))
    assert isinstance(done, ResearchOutcome)
    assert eof.log.get(done.session_id).metrics["clarification"]["status"] == "skipped"


def test_clarification_then_plan_approval_on_postgresql(tmp_path: Path, postgres_url: str) -> None:
    """Both pauses in one session, on the store's PostgreSQL database (the prompt update and the resume claim)."""
    store = StoreConfig(data_dir=tmp_path, database_url=postgres_url)  # type: ignore[arg-type]
    log = SessionLog.from_config(store)
    policy, search = script(None, tmp_path / "blocked")
    inner = policy.script
    policy.script = lambda context, stop: ASK if tuple(stop) == DECISION_STOPS else inner(context, stop)
    svc = ResearchService(policy, {"local_search": search}, log, AgentConfig(),
                          durable=DurableSessions.for_store(log, store, clarify=True))
    asked = asyncio.run(svc.start(QUESTION, OPTIONS, approve_plan=True))
    assert isinstance(asked, ResearchPaused) and asked.question == QUESTION_ASKED
    sid = asked.session_id
    plan = asyncio.run(svc.resume(sid, ClarificationAnswer(ANSWER)))
    assert isinstance(plan, ResearchPaused) and plan.question is None and plan.plan.rubric == ("the language",)
    assert clarification_block(QUESTION_ASKED, ANSWER) in log.get(sid).trajectory.prompt.text
    done = asyncio.run(svc.resume(sid, PlanDecision("accept")))
    assert isinstance(done, ResearchOutcome)
    rec = log.get(sid)
    assert rec.status == "completed" and rec.metrics["clarification"]["answer"] == ANSWER
    assert {t.prompt_sha for t in rec.trajectory.turns} == {rec.trajectory.prompt.prompt_sha}
    log.close()
