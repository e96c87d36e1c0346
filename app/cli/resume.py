"""`rubricem resume SESSION`, `rubricem ask --approve-plan / --clarify` and `rubricem sessions export
--edited-plans` (issue 21).

A resume checks the session before loading the model: an unknown, finished or non-durable session, or one another
process is still running (its lease is live, issue 34), is bad input (exit 2, nothing changed); a pause past its
expiry ends the session there (exit 1), so it can never be answered. A paused plan is answered with `--accept`,
`--reject` or `--rubric ... [--note ...]`, a clarifying question with `--answer TEXT` (empty: go on without
clarification), or either interactively; an answer that cannot be applied is
refused with a message and the session stays paused.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.approval import ApprovalError, PlanDecision, PlanForApproval
from agent.clarify import ClarificationAnswer, ClarificationError
from app.cli.common import Progress, with_adapter
from app.settings import Settings

Ask = Callable[[str], str]


def ask_stderr(prompt: str) -> str:
    """input() with the prompt on stderr: stdout carries only the report (`rubricem ask ... > report.md`)."""
    sys.stderr.write(prompt)
    sys.stderr.flush()
    line = sys.stdin.readline()
    if not line:
        raise EOFError("no answer on stdin: the plan still waits (answer it with `rubricem resume`)")
    return line.rstrip("\n")


def show_plan(plan: PlanForApproval, expires_at: str, out: Any = sys.stderr) -> None:
    """The paused plan, as the user reviews it."""
    print("\n=== the plan waits for your approval" + (f" (until {expires_at})" if expires_at else "") + " ===",
          file=out)
    print(f"deep analysis:\n  {plan.deep_analysis or '(none)'}", file=out)
    print("rubric:", file=out)
    for i, item in enumerate(plan.rubric, 1):
        print(f"  {i}. {item}", file=out)
    if not plan.rubric:
        print("  (no items)", file=out)
    print(f"research plan:\n  {plan.research_plan or '(none)'}", file=out)


def ask_decision(plan: PlanForApproval, ask: Ask = ask_stderr, out: Any = sys.stderr) -> PlanDecision:
    """Ask until the answer can be applied: accept, reject, or an edited rubric (one item a line) and a note."""
    while True:
        choice = ask("[a]ccept, [e]dit or [r]eject the plan? ").strip().lower()[:1]
        if choice == "a":
            return PlanDecision("accept")
        if choice == "r":
            return PlanDecision("reject")
        if choice != "e":
            print("answer a, e or r", file=out)
            continue
        print("the rubric, one item a line (empty line ends; '=' keeps the current items):", file=out)
        items: list[str] = []
        while (line := ask("  - ").strip()) != "":
            items.extend(plan.rubric if line == "=" else [line])
        note = ask("a note to the research plan (empty for none): ").strip()
        try:
            return PlanDecision.parse({"action": "edit", "rubric": items, "note": note})
        except ApprovalError as exc:
            print(f"not applied: {exc}; the plan still waits", file=out)


def show_question(question: str, expires_at: str, out: Any = sys.stderr) -> None:
    """The clarifying question, as the user reads it before the plan."""
    print("\n=== before planning, one question" + (f" (answer until {expires_at})" if expires_at else "") + " ===",
          file=out)
    print(f"  {question}", file=out)


def ask_clarification(ask: Ask = ask_stderr, out: Any = sys.stderr) -> ClarificationAnswer:
    """Ask until the answer can be applied; an empty answer goes on without clarification."""
    while True:
        try:
            return ClarificationAnswer.parse(ask("your answer (empty to go on without): "))
        except ClarificationError as exc:
            print(f"not applied: {exc}; the question still waits", file=out)


def decision_from_args(args: argparse.Namespace) -> PlanDecision | ClarificationAnswer | None:
    """The answer given on the command line, checked (ApprovalError, ClarificationError), or None."""
    answer = getattr(args, "answer", None)
    if args.accept + args.reject + bool(args.rubric) + (answer is not None) > 1:
        raise ApprovalError("give one of --accept, --reject, --rubric or --answer")
    if answer is not None:
        return ClarificationAnswer.parse(answer)
    if args.accept:
        return PlanDecision("accept")
    if args.reject:
        return PlanDecision("reject")
    if args.rubric or args.note:
        return PlanDecision.parse({"action": "edit", "rubric": args.rubric or [], "note": args.note or ""})
    return None


async def drive(first: Any, resume: Callable[[str, PlanDecision | ClarificationAnswer], Any],
                ask: Ask = ask_stderr) -> Any:
    """Answer pauses until the run ends: the ResearchOutcome, or None when the plan was rejected."""
    from app.service import ResearchPaused, ResearchRejected

    outcome = await first
    while isinstance(outcome, ResearchPaused):
        if outcome.question is not None:  # a clarifying question before the plan
            show_question(outcome.question, outcome.expires_at)
            try:
                answer = ask_clarification(ask)
            except EOFError:  # nobody to ask (stdin closed): go on without clarification, as an empty answer
                print("no answer on stdin: going on without clarification", file=sys.stderr)
                answer = ClarificationAnswer("")
            outcome = await resume(outcome.session_id, answer)
            continue
        show_plan(outcome.plan, outcome.expires_at)
        try:
            decision = ask_decision(outcome.plan, ask)
        except EOFError:  # nobody to ask (stdin closed): the session stays paused, resumable
            return outcome
        outcome = await resume(outcome.session_id, decision)
    return None if isinstance(outcome, ResearchRejected) else outcome


def _precheck(settings: Settings, session_id: str) -> None:
    """Refuse a session that cannot be resumed before the model is loaded (nothing is changed); end one whose pause
    has expired (RunFailedError: it is marked failed, its run state 'expired' with the reason)."""
    from app.container import durable_sessions
    from app.durable import ResumeError, end_if_expired, lease_refusal
    from app.service import RunFailedError
    from store.session_log import SessionLog
    from store.session_log.checkpoints import SessionRuns

    log = SessionLog.from_config(settings.store)
    try:
        rec = log.get(session_id)  # SessionNotFound: exit 2
        if not settings.sessions.checkpoints:
            raise ResumeError("durable sessions are off (RUBRICEM_SESSIONS__CHECKPOINTS=false): nothing to resume")
        if rec.status != "running":
            raise ResumeError(f"session {session_id} is {rec.status}: only an unfinished session can be resumed")
        run = SessionRuns(log).get(session_id)
        if run is None or run.state not in ("active", "awaiting_approval"):
            why = "was not run with checkpoints" if run is None else f"is {run.state}"
            raise ResumeError(f"session {session_id} {why}: it cannot be resumed")
        if run.state == "active" and (held := lease_refusal(log.lease(session_id), log.clock())) is not None:
            raise ResumeError(held)  # another process still runs it: a second writer would corrupt its trajectory
        durable = durable_sessions(settings, log)
        if durable is not None and (reason := end_if_expired(log, durable, run)) is not None:
            raise RunFailedError(session_id, reason)
    finally:
        log.close()


def cmd_resume(args: argparse.Namespace) -> int:
    from app.container import build
    from app.service import RunFailedError

    settings = with_adapter(Settings(), args.adapter)
    progress = Progress(args.quiet)
    decision = decision_from_args(args)  # a bad answer is refused before anything runs
    try:
        _precheck(settings, args.session_id)
    except RunFailedError as exc:
        print(f"error: the session could not go on ({exc}); session {exc.session_id} is marked failed",
              file=sys.stderr)
        return 1
    services = build(settings, say=progress.say, progress=progress.bar)
    svc = services.research

    async def go() -> Any:
        try:
            first = svc.resume(args.session_id, decision, on_event=progress.event)
            return await drive(first, lambda sid, d: svc.resume(sid, d, on_event=progress.event))
        finally:
            await services.policy.aclose()

    try:
        outcome = asyncio.run(go())
    except RunFailedError as exc:
        print(f"error: the session could not go on ({exc}); session {exc.session_id} is marked failed",
              file=sys.stderr)
        return 1
    return print_outcome(outcome, progress)


def print_outcome(outcome: Any, progress: Progress) -> int:
    """The report on stdout; a rejected plan ends the session without one (exit 0: the user's choice); a plan left
    waiting (no answer on stdin) exits 1 and says how to answer it."""
    from app.service import ResearchPaused

    if outcome is None:
        progress.say("the plan was rejected: the session ended without a report (recorded as rejected)")
        return 0
    if isinstance(outcome, ResearchPaused):
        what = "question" if outcome.question is not None else "plan"
        waits = "waits for your answer" if outcome.question is not None else "still waits for approval"
        print(f"the {what} of session {outcome.session_id} {waits}: answer it with "
              f"`rubricem resume {outcome.session_id}`", file=sys.stderr)
        return 1
    print(outcome.report.markdown)
    return 0


def cmd_export_edited_plans(args: argparse.Namespace) -> int:
    from store.session_log import SessionLog
    from store.session_log.checkpoints import SessionRuns

    log = SessionLog.from_config(Settings().store)
    rows = SessionRuns(log).edited_plans(limit=args.limit)
    lines = [json.dumps({
        "session_id": a.session_id, "owner": a.owner, "question": log.get(a.session_id).question,
        "policy_plan": a.policy_plan, "approved_plan": a.approved, "created_at": a.created_at,
    }, ensure_ascii=False) for a in rows]
    text = "".join(line + "\n" for line in lines)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
        print(f"{len(lines)} edited plan(s) written to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def add_parsers(sub: Any, sessions_sub: Any) -> None:
    """`resume`, and `sessions export --edited-plans`."""
    res = sub.add_parser("resume", help="go on with a session cut off by a crash, or answer its paused plan or "
                         "clarifying question")
    res.add_argument("session_id")
    res.add_argument("--accept", action="store_true", help="accept the paused plan")
    res.add_argument("--reject", action="store_true", help="reject the paused plan (the session ends)")
    res.add_argument("--rubric", action="append", help="edit: the plan's rubric items, whole (repeatable)")
    res.add_argument("--note", help="edit: a note to the research plan")
    res.add_argument("--answer", help="the answer to the paused clarifying question (empty: go on without)")
    res.add_argument("--quiet", action="store_true", help="no progress on stderr")
    res.add_argument("--adapter", help="as for ask")
    res.set_defaults(func=cmd_resume)
    exp = sessions_sub.add_parser("export", help="export (policy plan, approved plan) pairs as JSON lines")
    exp.add_argument("--edited-plans", action="store_true", required=True,
                     help="the plans users edited, beside the policy's own")
    exp.add_argument("--out", help="write to this file (default stdout)")
    exp.add_argument("--limit", type=int)
    exp.set_defaults(func=cmd_export_edited_plans)
