"""Judging logged sessions: completed, not-yet-judged sessions → groups by question → judge → stored judgements.

Every session of a batch ends in a stored judgement (status "ok") or a recorded failure (status "failed", retried
next time); a bad judge answer or a judge crash never stops the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from agent import telemetry
from learning.judge.feedback import feedback_rubrics
from learning.judge.types import Judgement, Rubric, TrajectoryJudge, Usage
from learning.judge.user_rubrics import session_user_rubrics
from store.people import own_feedback
from store.errors import SessionNotFound
from store.records import SessionRecord, normalise_question
from store.session_log import SessionLog

Progress = Callable[[str], None]


@dataclass
class JudgeRunSummary:
    """What one `judge_pending` call did."""

    judged: int = 0
    failed: int = 0
    groups: int = 0
    usage: Usage = field(default_factory=Usage)
    failed_stages: int = 0
    fallbacks: int = 0
    errors: list[str] = field(default_factory=list)
    judgements: dict[str, Judgement] = field(default_factory=dict)


def _usable(j: Judgement) -> bool:
    return any(v is not None for v in j.stage_scores().values())


async def judge_pending(
    log: SessionLog,
    judge: TrajectoryJudge,
    *,
    since: datetime | None = None,
    limit: int | None = None,
    progress: Progress | None = None,
) -> JudgeRunSummary:
    """Judge completed, unjudged sessions (oldest first) and store the results."""
    say = progress or (lambda _m: None)
    summary = JudgeRunSummary()
    records = [log.get(sid) for sid in log.completed_unjudged(since=since, limit=limit)]
    groups: dict[str, list[SessionRecord]] = {}
    own: dict[str, tuple[Rubric, ...]] = {}
    notes: dict[tuple[str, str], tuple[Rubric, ...]] = {}
    for rec in records:
        # A person's notes on their earlier answers to this question judge their own sessions of it only
        # (learning/judge/feedback): those sessions are a group of their own.
        mine = (normalise_question(rec.question), rec.owner)
        if mine not in notes:
            notes[mine] = feedback_rubrics(own_feedback(log, rec.question, rec.owner))
        # A session whose user edited its plan is judged alone, with the user's rubrics (learning/judge/user_rubrics).
        plan = session_user_rubrics(log, rec.session_id)
        own[rec.session_id] = plan + notes[mine]
        key = mine[0] + (f"\0{rec.owner}" if notes[mine] else "") + (f"\0{rec.session_id}" if plan else "")
        groups.setdefault(key, []).append(rec)
    for read in groups.values():
        # Deletion wins (issue 46): the epoch is read first, then the group again, so a session deleted since the
        # start is left out, and a deletion from here on keeps the judge from saving the question's buffer.
        seen = log.deletion_epoch()
        recs = _still_there(log, read)
        if not recs:
            say(f"skipped {len(read)} session(s) deleted while judging")
            continue
        summary.groups += 1
        say(f"judging {len(recs)} session(s): {recs[0].question[:80]!r}")
        try:
            # Plan rubrics and the owner's notes judge this group only: never added to the question's shared buffer.
            scoped = {"session_rubrics": own[recs[0].session_id]} if own[recs[0].session_id] else {}
            with telemetry.judge_group_span(kind=judge.kind, model=judge.model,
                                            sessions=[r.session_id for r in recs]):
                judgements = await judge.judge_group(recs[0].question, [r.trajectory for r in recs],
                                                     deletions_seen=seen, **scoped)
            if len(judgements) != len(recs):
                raise RuntimeError(f"the judge returned {len(judgements)} judgements for {len(recs)} sessions")
        except Exception as exc:  # a judge failure is recorded per session; the batch goes on
            message = f"{type(exc).__name__}: {exc}"
            summary.errors.append(message)
            for r in recs:
                log.record_judgement(r.session_id, judge.model or judge.kind, {"error": message}, status="failed",
                                     error=message, judge_kind=judge.kind)
                summary.failed += 1
            say(f"  failed: {message}")
            continue
        for r, j in zip(recs, judgements, strict=True):
            try:
                _store(log, r, j, summary, say)
            except Exception as exc:  # one unstorable judgement must not sink the others
                message = f"could not store the judgement: {type(exc).__name__}: {exc}"
                summary.errors.append(message)
                summary.failed += 1
                say(f"  {r.session_id}: {message}")
    return summary


def _still_there(log: SessionLog, recs: list[SessionRecord]) -> list[SessionRecord]:
    """The group's sessions read again, less those deleted since the batch was read."""
    found = []
    for r in recs:
        try:
            found.append(log.get(r.session_id))
        except SessionNotFound:
            continue
    return found


def _store(log: SessionLog, r: SessionRecord, j: Judgement, summary: JudgeRunSummary, say: Progress) -> None:
    """Record one judgement: ok when any stage has a score, else a failed attempt (offered again next run)."""
    payload = j.model_dump(mode="json")
    summary.usage = summary.usage + j.usage
    summary.failed_stages += j.failed_stages
    summary.fallbacks += int(j.fallback_answer_only)
    if not _usable(j):
        message = "no stage could be scored"
        log.record_judgement(r.session_id, j.judge_model, payload, status="failed", error=message,
                             judge_kind=j.judge_kind, rubric_version=j.rubric_version)
        summary.failed += 1
        say(f"  {r.session_id}: failed ({message})")
        return
    log.record_judgement(r.session_id, j.judge_model, payload, judge_kind=j.judge_kind,
                         rubric_version=j.rubric_version)
    summary.judged += 1
    summary.judgements[r.session_id] = j
    say(f"  {r.session_id}: " + ", ".join(
        f"{s}={'-' if v is None else f'{v:.2f}'}" for s, v in j.stage_scores().items()))
