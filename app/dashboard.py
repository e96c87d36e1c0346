"""Data for the learning page: policy versions, alias moves, retraining cycles, per-stage reward curves, bank size
and a summary, as frozen rows read from the registry, the session log and the rubric bank (no Streamlit here)."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agent.accounting import PriceTable, UsageTotals, total_usage, usages
from store.db import Backend, json_number
from store.errors import InvalidInput
from store.records import STAGES, Stage
from store.registry import BASE, Cycle, PolicyVersion, Registry
from store.rubric_bank import RubricBank
from store.session_log import SessionLog

__all__ = [
    "AliasRow",
    "CurvePoint",
    "CycleRow",
    "DashboardSummary",
    "StagePoint",
    "VersionRow",
    "alias_history",
    "bank_size",
    "cycle_rows",
    "cycle_usage",
    "stage_reward_curve",
    "stage_reward_points",
    "summary",
    "version_rows",
]

CurveKey = Literal["version", "day"]

# The stage a cycle had reached, inferred from what it recorded: finish_cycle overwrites `stage` with "done", but the
# numbers each stage merges in stay (learning/pipeline.py), so a failed or rejected cycle still shows how far it got.
_STAGE_MARKERS: tuple[tuple[str, str], ...] = (("candidate_score", "evaluated"), ("trained_adapter", "trained"),
                                                ("judged", "judged"))


@dataclass(frozen=True, slots=True)
class VersionRow:
    """One policy version with the headline numbers of its promotion-gate report."""

    name: str
    number: int
    status: str  # candidate | promoted | rejected
    parent: str | None
    created_at: str
    reason: str | None  # why it was promoted or rejected
    live: bool
    training_run: str = ""
    eval_total: float | None = None  # held-out probe mean reward of this version (the gate's candidate total)
    eval_live_total: float | None = None  # the live version's total it was compared with
    eval_stages: Mapping[str, float] = field(default_factory=dict)  # per-stage held-out means
    eval_runs: int | None = None
    eval_failed_runs: int | None = None
    eval_judge: str | None = None
    team: str | None = None  # issue 49: the team it was trained for; None for the global policy


@dataclass(frozen=True, slots=True)
class AliasRow:
    """One move of an alias (promotion, rollback, or the initial base)."""

    alias: str
    version: str
    previous: str | None
    action: str  # init | promote | rollback
    reason: str
    created_at: str


@dataclass(frozen=True, slots=True)
class CycleRow:
    """One retraining cycle or recorded scheduler skip."""

    cycle_id: str
    trigger: str
    status: str  # running | promoted | rejected | skipped | failed
    stage: str  # the last stage reached (start, judged, trained, registered, evaluated), "done" once finished
    stage_reached: str  # the furthest working stage, also for finished cycles
    candidate: str | None
    reason: str | None  # the error, skip reason, or gate/rejection reason
    started_at: str
    finished_at: str | None
    new_sessions: int | None = None
    skipped_sessions: int | None = None  # left out: their owner does not consent, or they were opted out
    judged: int | None = None
    judge_failures: int | None = None
    candidate_score: float | None = None
    live_score: float | None = None
    numbers: Mapping[str, Any] = field(default_factory=dict)  # everything the cycle recorded
    window_start: str | None = None  # its data window: sessions finished in (window_start, window_end]
    window_end: str = ""


@dataclass(frozen=True, slots=True)
class StagePoint:
    """The per-stage scores of one judged, completed session (its latest "ok" judgement)."""

    session_id: str
    created_at: str  # the session's creation time (UTC ISO-8601)
    policy_version: str
    judge_kind: str
    scores: Mapping[str, float | None]  # one entry per stage in STAGES order; None = unscorable

    @property
    def day(self) -> str:
        """The UTC day the session was created (YYYY-MM-DD)."""
        return self.created_at[:10]


@dataclass(frozen=True, slots=True)
class CurvePoint:
    """The mean score of one stage over the sessions of one key (a policy version or a day)."""

    key: str
    stage: str
    mean: float | None  # None when no session of this key had a score for this stage
    count: int  # scores averaged
    missing: int  # sessions whose score for this stage was None


@dataclass(frozen=True, slots=True)
class DashboardSummary:
    """Headline numbers of the learning page."""

    live_version: str
    versions: int  # trained versions (policy@N); the base model is not counted
    promoted: int
    rejected: int
    candidates: int
    sessions_total: int
    sessions_completed: int
    sessions_judged: int  # completed with an "ok" judgement
    sessions_unjudged: int  # completed without one (what the next judging run picks up)
    bank_size: int | None  # None when the bank could not be read
    last_cycle_status: str | None
    last_cycle_at: str | None


# ---- small readers -------------------------------------------------------------------------------------------------


def _number(value: object) -> float | None:
    """A finite number from stored JSON, else None (bools are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _eval_numbers(report: Mapping[str, Any] | None) -> dict[str, Any]:
    """Headline numbers of a gate report (learning.evaluate.GateReport.as_dict); other shapes give Nones."""
    if not isinstance(report, Mapping):
        return {}
    cand = report.get("candidate")
    live = report.get("live")
    cand = cand if isinstance(cand, Mapping) else {}
    live = live if isinstance(live, Mapping) else {}
    stages = cand.get("stages")
    stage_means = {}
    if isinstance(stages, Mapping):
        stage_means = {s: v for s in STAGES if (v := _number(stages.get(s))) is not None}
    return {
        "eval_total": _number(cand.get("total")),
        "eval_live_total": _number(live.get("total")),
        "eval_stages": stage_means,
        "eval_runs": _count(cand.get("runs")),
        "eval_failed_runs": _count(cand.get("failed_runs")),
        "eval_judge": _text(report.get("judge")),
    }


def _version_row(v: PolicyVersion, live: Collection[str]) -> VersionRow:
    return VersionRow(name=v.name, number=v.number, status=v.status, parent=v.parent, created_at=v.created_at,
                      reason=v.reason, live=v.name in live, training_run=v.training_run,
                      **_eval_numbers(v.eval_report), team=v.team)


def _stage_reached(c: Cycle) -> str:
    if c.stage != "done":
        return c.stage
    if "candidate_score" not in c.numbers and c.candidate:
        return "registered"  # registered, then rejected before the gate ran (e.g. non-finite weights)
    for key, stage in _STAGE_MARKERS:
        if key in c.numbers:
            return stage
    return "start"


def _cycle_row(c: Cycle) -> CycleRow:
    n = dict(c.numbers)
    return CycleRow(
        cycle_id=c.cycle_id, trigger=c.trigger, status=c.status, stage=c.stage, stage_reached=_stage_reached(c),
        candidate=c.candidate, reason=c.error or _text(n.get("reason")), started_at=c.started_at,
        finished_at=c.finished_at, new_sessions=_count(n.get("new_sessions")),
        skipped_sessions=_count(n.get("skipped_sessions")), judged=_count(n.get("judged")),
        judge_failures=_count(n.get("judge_failures")), candidate_score=_number(n.get("candidate_score")),
        live_score=_number(n.get("live_score")), numbers=n, window_start=c.window_start, window_end=c.window_end,
    )


# ---- public API ----------------------------------------------------------------------------------------------------


def version_rows(registry: Registry, teams: Collection[str] | None = None) -> list[VersionRow]:
    """Every policy version in creation order (base first), with its gate numbers and whether it is live now (the
    global alias, or its team's).

    Args:
        registry: The policy registry.
        teams: Whose team versions to show (a person sees the global policy's and their own team's, issue 49);
            None: every team's (admins).

    Returns:
        One row per version, oldest first.
    """
    from store.teams import Teams

    live = {registry.live().name} | {t.live_version for t in Teams(registry.log).list() if t.live_version}
    return [_version_row(v, live) for v in reversed(registry.versions())
            if v.team is None or teams is None or v.team in teams]


def alias_history(registry: Registry, limit: int = 50) -> list[AliasRow]:
    """Promotions and rollbacks of the live alias with their reasons, newest first.

    Args:
        registry: The policy registry.
        limit: At most this many moves.
    """
    return [AliasRow(h.alias, h.version, h.previous, h.action, h.reason, h.created_at)
            for h in registry.history(limit)]


def cycle_rows(registry: Registry, limit: int = 50, teams: Collection[str] | None = None) -> list[CycleRow]:
    """Retraining cycles and scheduler skips, newest first, with their outcome and key numbers.

    Args:
        registry: The policy registry.
        limit: At most this many cycles.
        teams: Whose team cycles to show (as `version_rows`); None: every team's.
    """
    return [_cycle_row(c) for c in registry.cycles(limit) if c.team is None or teams is None or c.team in teams]


def cycle_usage(registry: Registry, rows: Iterable[CycleRow], prices: PriceTable) -> dict[str, UsageTotals]:
    """Tokens and cost of each cycle that judged its data window: the policy's tokens serving the window's sessions
    and the judge's tokens on them (their judgements), priced under the table (`agent.accounting`).

    What the session log cannot say is not in it: the training rollouts and the promotion-gate probes run on the
    trainer's own logs (DATA_DIR/runs, DATA_DIR/retrain), and a cycle records no token counts of its own. The window
    is read as it is now (a session opted out or deleted since is no longer counted), and a failed cycle's window is
    retried by the next one, so sessions can count in both. Cycles that never judged (skipped, or failed before
    judging) have no entry.

    Args:
        registry: The policy registry (its session log holds the sessions).
        rows: Cycles from `cycle_rows`.
        prices: The price table (`Settings.prices`).
    """
    out: dict[str, UsageTotals] = {}
    for row in rows:
        if "judged" not in row.numbers or not row.window_end:
            continue
        ids = registry.sessions_in_window(row.window_start, row.window_end)
        out[row.cycle_id] = total_usage(usages(registry.log, ids, prices).values())
    return out


def _points_sql(backend: Backend) -> str:
    """The latest "ok" judgement per completed session (one point per session, however many judges looked at it),
    with only the four stage scores pulled out of the payload, so no trajectory or rubric justification is loaded."""
    return (
        "SELECT s.session_id, s.created_at, s.policy_version, j.judge_kind, "
        + ", ".join(json_number(backend, "j.payload_json", "stages", s, "score") for s in STAGES)
        + " FROM sessions s JOIN judgements j ON j.session_id = s.session_id "
        "WHERE s.status = 'completed' AND j.status = 'ok' AND j.judgement_id = ("
        "SELECT MAX(k.judgement_id) FROM judgements k WHERE k.session_id = s.session_id AND k.status = 'ok') "
        "ORDER BY s.created_at, s.rowid"
    )


def stage_reward_points(log: SessionLog) -> list[StagePoint]:
    """The per-stage judge scores of every judged, completed session, oldest session first.

    Reads one query in a read transaction. A session with several "ok" judgements contributes its latest one;
    failed judgements are ignored. A stage score that is missing or not a finite number is None.

    Args:
        log: The session log.
    """
    with log.transaction(write=False) as conn:
        rows = conn.execute(_points_sql(log.backend)).fetchall()
    return [
        StagePoint(session_id=str(r[0]), created_at=str(r[1]), policy_version=str(r[2]), judge_kind=str(r[3]),
                   scores={s: _number(v) for s, v in zip(STAGES, r[4:], strict=True)})
        for r in rows
    ]


def stage_reward_curve(points: Iterable[StagePoint], by: CurveKey) -> list[CurvePoint]:
    """Mean score per stage per policy version or per UTC day.

    Keys come in order of first appearance (chronological for points from `stage_reward_points`); within a key,
    stages in STAGES order. None scores are skipped and counted in `missing`.

    Args:
        points: Per-session stage scores.
        by: "version" (the session's policy version) or "day" (the session's UTC creation day).

    Raises:
        InvalidInput: `by` is neither "version" nor "day".
    """
    if by not in ("version", "day"):
        raise InvalidInput(f"by must be 'version' or 'day', got {by!r}")
    key_of: Callable[[StagePoint], str] = (lambda p: p.policy_version) if by == "version" else (lambda p: p.day)
    sums: dict[str, dict[Stage, list[float]]] = {}
    missing: dict[str, dict[Stage, int]] = {}
    for p in points:
        key = key_of(p)
        per_stage = sums.setdefault(key, {s: [] for s in STAGES})
        gaps = missing.setdefault(key, dict.fromkeys(STAGES, 0))
        for s in STAGES:
            score = p.scores.get(s)
            if score is None:
                gaps[s] += 1
            else:
                per_stage[s].append(score)
    return [
        CurvePoint(key=key, stage=s, mean=(sum(vals) / len(vals)) if vals else None, count=len(vals),
                   missing=missing[key][s])
        for key, per_stage in sums.items()
        for s, vals in per_stage.items()
    ]


BankSource = RubricBank | Callable[[], RubricBank] | None


def bank_size(bank: BankSource) -> int | None:
    """Number of items in the rubric bank, or None when it cannot be opened or read (never raises).

    Args:
        bank: An open RubricBank, a function that opens one (its failure is caught too), or None.
    """
    if bank is None:
        return None
    try:
        opened = bank() if not isinstance(bank, RubricBank) else bank
        return int(opened.count())
    except Exception:  # noqa: BLE001 - the page shows "unavailable" for a bank it cannot reach, whatever the cause
        return None


_SESSION_COUNTS_SQL = (
    "SELECT COUNT(*), "
    "COALESCE(SUM(CASE WHEN s.status = 'completed' THEN 1 ELSE 0 END), 0), "
    "COALESCE(SUM(CASE WHEN s.status = 'completed' AND EXISTS (SELECT 1 FROM judgements j "
    "WHERE j.session_id = s.session_id AND j.status = 'ok') THEN 1 ELSE 0 END), 0) "
    "FROM sessions s"
)


def _statuses(rows: Sequence[VersionRow], status: str) -> int:
    return sum(1 for r in rows if r.status == status)


def summary(registry: Registry, log: SessionLog, bank: BankSource) -> DashboardSummary:
    """Headline numbers: live version, trained versions by status, sessions, bank size and the last cycle.

    Args:
        registry: The policy registry.
        log: The session log (normally `registry.log`).
        bank: As for `bank_size`.
    """
    trained = [r for r in version_rows(registry) if r.name != BASE]
    live = registry.live().name
    with log.transaction(write=False) as conn:
        total, completed, judged = (int(x) for x in conn.execute(_SESSION_COUNTS_SQL).fetchone())
    last = registry.cycles(1)
    return DashboardSummary(
        live_version=live, versions=len(trained), promoted=_statuses(trained, "promoted"),
        rejected=_statuses(trained, "rejected"), candidates=_statuses(trained, "candidate"),
        sessions_total=total, sessions_completed=completed, sessions_judged=judged,
        sessions_unjudged=completed - judged, bank_size=bank_size(bank),
        last_cycle_status=last[0].status if last else None, last_cycle_at=last[0].started_at if last else None,
    )
