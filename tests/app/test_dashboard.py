"""The learning page's data layer on a real session log (SQLite, and PostgreSQL on the test server), a real registry
and a real embedded-Chroma rubric bank: version rows with gate numbers, alias history, cycles, per-stage reward curves,
bank size and the summary."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from app.dashboard import (
    CurvePoint,
    StagePoint,
    alias_history,
    bank_size,
    cycle_rows,
    cycle_usage,
    stage_reward_curve,
    stage_reward_points,
    summary,
    version_rows,
)
from agent.accounting import ModelPrice, format_cost
from learning.evaluate import VersionScore, decide
from learning.judge.offline import OfflineJudge
from learning.judge.pipeline import judge_pending
from learning.judge.types import Judgement, StageResult
from store.config import StoreConfig
from store.errors import InvalidInput
from store.records import STAGES, BankItem, PromptRecord, Stage, Trajectory, Turn
from store.registry import BASE, Registry
from store.rubric_bank import RubricBank
from store.session_log import SessionLog
from tests.judge.builders import trajectory

T0 = datetime(2031, 3, 1, 9, 0, tzinfo=UTC)
PROMPT = PromptRecord(text="User: q", token_ids=(1, 2, 3), prompt_sha="p")


class Clock:
    """A settable clock, so the log's timestamps (sessions, versions, cycles) are chosen by the test."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **kwargs: float) -> None:
        self.now += timedelta(**kwargs)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=["sqlite", "postgresql"])
def log(request: pytest.FixtureRequest, tmp_path: Path, clock: Clock) -> Iterator[SessionLog]:
    if request.param == "postgresql":
        opened = SessionLog(database_url=request.getfixturevalue("postgres_url"), clock=clock)
    else:
        opened = SessionLog(tmp_path / "data" / "rubricem.sqlite3", clock=clock)
    with opened:
        yield opened


@pytest.fixture
def registry(log: SessionLog) -> Registry:
    return Registry(log)


@pytest.fixture
def bank(tmp_path: Path) -> RubricBank:
    return RubricBank(StoreConfig(data_dir=tmp_path / "data"))


def adapter(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": 4}))
    return path


def judgement(session_id: str, scores: Mapping[Stage, float | None], kind: str = "offline") -> dict[str, object]:
    """A judge payload exactly as learning/judge/pipeline.py stores it."""
    j = Judgement(session_id=session_id, question="q", judge_model=f"{kind}-judge", judge_kind=kind,  # type: ignore[arg-type]
                  stages={s: StageResult(stage=s, score=v) for s, v in scores.items()},
                  failed_stages=sum(v is None for v in scores.values()))
    return j.model_dump(mode="json")


def completed(log: SessionLog, version: str, question: str = "q?") -> str:
    sid = log.create_session(question, PROMPT, {}, version)
    log.finish(sid, "completed", report="r")
    return sid


def gate(candidate: float, live: float, stages: dict[str, float]) -> dict[str, object]:
    """A real promotion-gate report (learning.evaluate.decide) as the retrain cycle stores it."""
    report = decide(VersionScore("cand", stages, candidate, 4, 0), VersionScore("live", {}, live, 4, 0), 0.02,
                    "offline-minilm")
    return report.as_dict()


def test_an_empty_database_gives_empty_rows_and_a_summary_of_zeros(registry: Registry, log: SessionLog,
                                                                    bank: RubricBank) -> None:
    (base,) = version_rows(registry)
    assert (base.name, base.number, base.status, base.live, base.parent) == (BASE, 0, "promoted", True, None)
    assert base.eval_total is None and base.eval_stages == {} and base.reason == "the base model"
    assert [h.action for h in alias_history(registry)] == ["init"]
    assert cycle_rows(registry) == []
    assert stage_reward_points(log) == []
    assert stage_reward_curve([], "version") == [] and stage_reward_curve([], "day") == []
    s = summary(registry, log, bank)
    assert (s.live_version, s.versions, s.promoted, s.rejected, s.candidates) == (BASE, 0, 0, 0, 0)
    assert (s.sessions_total, s.sessions_completed, s.sessions_judged, s.sessions_unjudged) == (0, 0, 0, 0)
    assert s.bank_size == 0 and s.last_cycle_status is None and s.last_cycle_at is None


def test_version_rows_carry_status_reasons_gate_numbers_and_the_live_flag(registry: Registry, clock: Clock,
                                                                          tmp_path: Path) -> None:
    clock.advance(hours=1)
    v1 = registry.register(adapter(tmp_path / "a1"), parent=BASE, training_run="cycle-1")
    promoted_report = gate(0.61, 0.55, {"plan": 0.7, "research": 0.5, "review": 0.6, "answer": 0.64})
    registry.set_eval_report(v1.name, promoted_report)
    registry.promote(v1.name, str(promoted_report["reason"]))
    clock.advance(hours=1)
    v2 = registry.register(adapter(tmp_path / "a2"), parent=v1.name, training_run="cycle-2")
    rejected_report = gate(0.40, 0.61, {"plan": 0.4, "research": 0.3, "review": 0.5, "answer": 0.4})
    registry.reject(v2.name, str(rejected_report["reason"]), rejected_report)
    clock.advance(hours=1)
    v3 = registry.register(adapter(tmp_path / "a3"), parent=v1.name)
    registry.reject(v3.name, "non-finite adapter weights in 1 tensor(s)")  # rejected before the gate: no report
    clock.advance(hours=1)
    v4 = registry.register(adapter(tmp_path / "a4"), parent=v1.name)
    registry.set_eval_report(v4.name, {"finite": False, "candidate": {"total": "n/a"}})  # an odd report shape
    registry.promote(v4.name, "manual")
    registry.rollback("bad answers reported")

    rows = version_rows(registry)
    assert [r.name for r in rows] == [BASE, "policy@1", "policy@2", "policy@3", "policy@4"]
    assert [r.status for r in rows] == ["promoted", "promoted", "rejected", "rejected", "promoted"]
    assert [r.live for r in rows] == [False, True, False, False, False]  # rolled back to policy@1
    assert [r.parent for r in rows] == [None, BASE, "policy@1", "policy@1", "policy@1"]
    assert [r.created_at[:13] for r in rows] == ["2031-03-01T09", "2031-03-01T10", "2031-03-01T11",
                                                 "2031-03-01T12", "2031-03-01T13"]
    one, two, three, four = rows[1:]
    assert one.reason == promoted_report["reason"] and str(one.reason).startswith("probe score 0.6100 >=")
    assert (one.eval_total, one.eval_live_total, one.eval_runs, one.eval_failed_runs, one.eval_judge) == (
        0.61, 0.55, 4, 0, "offline-minilm")
    assert one.eval_stages == {"plan": 0.7, "research": 0.5, "review": 0.6, "answer": 0.64}
    assert one.training_run == "cycle-1"
    assert two.reason is not None and two.reason.startswith("probe score 0.4000 < live 0.6100")
    assert (two.eval_total, two.eval_live_total) == (0.40, 0.61) and two.eval_stages["research"] == 0.3
    assert three.reason == "non-finite adapter weights in 1 tensor(s)" and three.eval_total is None
    assert three.eval_stages == {} and three.eval_runs is None
    assert four.eval_total is None and four.eval_live_total is None and four.reason == "manual"

    history = alias_history(registry)
    assert [(h.action, h.version, h.previous) for h in history] == [
        ("rollback", "policy@1", "policy@4"), ("promote", "policy@4", "policy@1"), ("promote", "policy@1", BASE),
        ("init", BASE, None)]
    assert history[0].reason == "bad answers reported" and history[2].reason == promoted_report["reason"]
    assert len(alias_history(registry, limit=2)) == 2


def test_cycle_rows_show_outcome_stage_reached_reason_and_numbers(registry: Registry, clock: Clock,
                                                                  tmp_path: Path) -> None:
    log = registry.log
    # 1: a full cycle that promoted its candidate.
    c = registry.start_cycle("cli", log.now())
    registry.advance_cycle(c.cycle_id, "judged", numbers={"new_sessions": 6, "judged": 5, "judge_failures": 1})
    registry.advance_cycle(c.cycle_id, "trained", numbers={"questions": 4, "trained_adapter": "/x"})
    v = registry.register(adapter(tmp_path / "a1"), parent=BASE, training_run=c.cycle_id)
    registry.advance_cycle(c.cycle_id, "registered", candidate=v.name)
    registry.advance_cycle(c.cycle_id, "evaluated", numbers={"candidate_score": 0.6, "live_score": 0.5})
    registry.promote(v.name, "probe score 0.6000 >= live 0.5000 - tolerance 0.02")
    clock.advance(minutes=30)
    registry.finish_cycle(c.cycle_id, "promoted", numbers={"reason": "probe score 0.6000 >= live 0.5000 - tolerance "
                                                                     "0.02"})
    # 2: a scheduler skip; 3: a cycle that failed while training; 4: a candidate rejected before the gate.
    clock.advance(hours=1)
    registry.record_skip("scheduler", "2 new session(s) < min_new_sessions 5", {"new_sessions": 2})
    clock.advance(hours=1)
    f = registry.start_cycle("scheduler", log.now())
    registry.advance_cycle(f.cycle_id, "judged", numbers={"new_sessions": 7, "judged": 7, "judge_failures": 0})
    clock.advance(minutes=5)
    registry.finish_cycle(f.cycle_id, "failed", error="RuntimeError: CUDA out of memory")
    clock.advance(hours=1)
    r = registry.start_cycle("cli", log.now())
    registry.advance_cycle(r.cycle_id, "judged", numbers={"new_sessions": 3, "judged": 3, "judge_failures": 0})
    registry.advance_cycle(r.cycle_id, "trained", numbers={"trained_adapter": "/y"})
    w = registry.register(adapter(tmp_path / "a2"), parent=v.name)
    registry.advance_cycle(r.cycle_id, "registered", candidate=w.name)
    registry.reject(w.name, "non-finite adapter weights")
    registry.finish_cycle(r.cycle_id, "rejected", numbers={"reason": "non-finite adapter weights"})
    # 5: a cycle still running after judging.
    clock.advance(hours=1)
    g = registry.start_cycle("cli", log.now())
    registry.advance_cycle(g.cycle_id, "judged", numbers={"new_sessions": 1, "judged": 1, "judge_failures": 0})

    rows = cycle_rows(registry)
    assert [x.status for x in rows] == ["running", "rejected", "failed", "skipped", "promoted"]
    assert [x.trigger for x in rows] == ["cli", "cli", "scheduler", "scheduler", "cli"]
    assert [x.stage_reached for x in rows] == ["judged", "registered", "judged", "start", "evaluated"]
    running, rejected, failed, skipped, promoted = rows
    assert (running.stage, running.finished_at, running.reason, running.new_sessions) == ("judged", None, None, 1)
    assert rejected.candidate == "policy@2" and rejected.reason == "non-finite adapter weights"
    assert failed.reason == "RuntimeError: CUDA out of memory" and failed.candidate is None
    assert (failed.new_sessions, failed.judged, failed.judge_failures) == (7, 7, 0)
    assert skipped.reason == "2 new session(s) < min_new_sessions 5" and skipped.new_sessions == 2
    assert skipped.candidate_score is None and skipped.judged is None
    assert promoted.stage == "done" and promoted.candidate == "policy@1"
    assert (promoted.candidate_score, promoted.live_score, promoted.judged, promoted.judge_failures) == (0.6, 0.5, 5, 1)
    assert promoted.reason is not None and promoted.reason.startswith("probe score 0.6000")
    assert promoted.numbers["questions"] == 4 and promoted.finished_at is not None
    assert promoted.finished_at > promoted.started_at
    assert [x.cycle_id for x in cycle_rows(registry, limit=2)] == [g.cycle_id, r.cycle_id]

    s = summary(registry, log, None)
    assert (s.last_cycle_status, s.live_version, s.versions, s.promoted, s.rejected) == ("running", "policy@1", 2, 1, 1)
    assert s.bank_size is None


def served(log: SessionLog, model: str, prompt: int, sampled: int, judge_tokens: tuple[int, int] = (0, 0)) -> str:
    """A completed session whose one answer turn read `prompt` tokens and sampled `sampled`, judged by an LLM judge
    that used `judge_tokens` (prompt, completion)."""
    sid = log.create_session("q?", PROMPT, {}, BASE, policy_model=model)
    log.append_turn(sid, Turn("answer", "sampled", "a", tuple(range(sampled)), prompt_tokens=prompt))
    log.finish(sid, "completed", report="r")
    log.record_judgement(sid, "judge-x", {"usage": {"calls": 1, "prompt_tokens": judge_tokens[0],
                                                    "completion_tokens": judge_tokens[1]}})
    return sid


def test_cost_per_cycle_sums_its_windows_sessions_and_their_judgements(registry: Registry, clock: Clock) -> None:
    log = registry.log
    served(log, "gpt-x", 1_000, 10, (2_000, 100))
    served(log, "gpt-x", 3_000, 30)
    clock.advance(minutes=1)
    first = registry.start_cycle("cli", log.now())
    registry.advance_cycle(first.cycle_id, "judged", numbers={"new_sessions": 2, "judged": 2})
    registry.finish_cycle(first.cycle_id, "rejected", numbers={"reason": "no gain"})
    clock.advance(minutes=1)
    served(log, "mystery-model", 500, 5)  # not in the table: the second cycle's cost is unknown
    clock.advance(minutes=1)
    registry.record_skip("scheduler", "1 new session(s) < min_new_sessions 5", {"new_sessions": 1})  # judged nothing
    second = registry.start_cycle("cli", log.now())
    registry.advance_cycle(second.cycle_id, "judged", numbers={"new_sessions": 1, "judged": 1})
    prices = {"gpt-x": ModelPrice(input_per_mtok=1.0, output_per_mtok=10.0),
              "judge-x": ModelPrice(input_per_mtok=0.5, output_per_mtok=2.0)}

    rows = cycle_rows(registry)
    spent = cycle_usage(registry, rows, prices)
    assert set(spent) == {first.cycle_id, second.cycle_id}  # the skip judged nothing: no entry
    one = spent[first.cycle_id]
    assert (one.sessions, one.prompt_tokens, one.sampled_tokens) == (2, 4_000, 40)
    assert (one.judge_prompt_tokens, one.judge_completion_tokens) == (2_000, 100)
    assert one.policy_cost == pytest.approx(0.0044) and one.judge_cost == pytest.approx(0.0012)
    assert format_cost(one.total_cost) == "$0.0056"
    two = spent[second.cycle_id]
    assert (two.sessions, two.prompt_tokens, two.policy_cost, format_cost(two.total_cost)) == (1, 500, None, "unknown")
    assert cycle_usage(registry, rows, {})[second.cycle_id].total_cost == 0.0  # no table: every model costs 0


def test_stage_curves_use_each_completed_sessions_latest_ok_judgement(log: SessionLog, registry: Registry,
                                                                      clock: Clock, bank: RubricBank) -> None:
    a = completed(log, BASE)
    log.record_judgement(a, "offline-judge", judgement(a, {"plan": 0.2, "research": 0.4, "review": None,
                                                           "answer": 0.6}), judge_kind="offline")
    clock.advance(hours=2)
    b = completed(log, BASE)
    # A failed attempt first (retried later): never counted, even with scores in its payload.
    log.record_judgement(b, "llm-judge", judgement(b, dict.fromkeys(STAGES, 1.0), "llm"), status="failed",
                         error="no stage could be scored", judge_kind="llm")
    log.record_judgement(b, "llm-judge", judgement(b, {"plan": 0.4, "research": 0.6, "review": 0.8, "answer": 1.0},
                                                   "llm"), judge_kind="llm")
    clock.advance(days=1)
    c = completed(log, "policy@1")
    log.record_judgement(c, "offline-judge", judgement(c, dict.fromkeys(STAGES, 0.1)), judge_kind="offline")
    log.record_judgement(c, "llm-judge", judgement(c, {"plan": 0.9, "research": 0.5, "answer": 0.7}, "llm"),
                         judge_kind="llm")  # re-judged: the latest ok judgement counts; "review" absent -> None
    clock.advance(hours=1)
    d = completed(log, "policy@1")
    log.record_judgement(d, "llm-judge", {"error": "judge crashed"}, status="failed", error="judge crashed")
    completed(log, "policy@1")  # never judged
    running = log.create_session("still researching", PROMPT, {}, "policy@1")
    failed = log.create_session("broke", PROMPT, {}, "policy@1")
    log.finish(failed, "failed", error="policy server unreachable")
    assert running and failed

    points = stage_reward_points(log)
    assert [p.session_id for p in points] == [a, b, c]  # oldest first; failed judgements and sessions left out
    assert points[0] == StagePoint(a, points[0].created_at, BASE, "offline",
                                   {"plan": 0.2, "research": 0.4, "review": None, "answer": 0.6})
    assert points[1].scores == {"plan": 0.4, "research": 0.6, "review": 0.8, "answer": 1.0}
    assert points[1].judge_kind == "llm"
    assert points[2].scores == {"plan": 0.9, "research": 0.5, "review": None, "answer": 0.7}
    assert [p.day for p in points] == ["2031-03-01", "2031-03-01", "2031-03-02"]

    by_version = {(p.key, p.stage): p for p in stage_reward_curve(points, "version")}
    assert [k for k, _ in by_version][::4] == [BASE, "policy@1"]  # keys in order of first appearance
    assert by_version[(BASE, "plan")] == CurvePoint(BASE, "plan", pytest.approx(0.3), 2, 0)  # type: ignore[arg-type]
    assert by_version[(BASE, "review")] == CurvePoint(BASE, "review", 0.8, 1, 1)
    assert by_version[(BASE, "answer")].mean == pytest.approx(0.8)
    assert by_version[("policy@1", "review")] == CurvePoint("policy@1", "review", None, 0, 1)
    assert by_version[("policy@1", "plan")] == CurvePoint("policy@1", "plan", 0.9, 1, 0)
    by_day = stage_reward_curve(points, "day")
    assert [(p.key, p.stage) for p in by_day] == [(day, s) for day in ("2031-03-01", "2031-03-02") for s in STAGES]
    assert by_day[1].mean == pytest.approx(0.5) and by_day[1].count == 2  # research on day one: (0.4 + 0.6) / 2
    with pytest.raises(InvalidInput, match="version.*day"):
        stage_reward_curve(points, "week")  # type: ignore[arg-type]

    s = summary(registry, log, bank)
    assert (s.sessions_total, s.sessions_completed, s.sessions_judged, s.sessions_unjudged) == (7, 5, 3, 2)
    assert s.bank_size == 0 and s.versions == 0


def write_session(log: SessionLog, traj: Trajectory, version: str) -> str:
    sid = log.create_session(traj.question, traj.prompt, {}, version)
    turns = iter(traj.turns)
    for call in traj.tool_calls:  # builder order: a research call turn, its tool output, then the next call
        for turn in turns:
            log.append_turn(sid, turn)
            if turn.kind == "tool_output":
                break
        log.append_tool_call(sid, call)
    for turn in turns:
        log.append_turn(sid, turn)
    log.finish(sid, "completed", report="Latin.")
    return sid


def test_points_read_what_the_real_judging_pipeline_stores(log: SessionLog) -> None:
    ids = [write_session(log, trajectory(f"s{i}", queries=("Haymo of Faversham",) * (i + 1)), BASE) for i in range(2)]
    ids.append(write_session(log, trajectory("s2", plan=None, review=None), "policy@1"))
    run = asyncio.run(judge_pending(log, OfflineJudge(log)))
    assert run.judged == 3 and run.failed == 0
    points = {p.session_id: p for p in stage_reward_points(log)}
    assert list(points) == ids
    for sid in ids:
        (stored,) = log.judgements(sid)
        expected = {s: stored.payload["stages"][s]["score"] for s in STAGES}
        assert points[sid].scores == expected and points[sid].judge_kind == "offline"
        assert expected["answer"] is not None
    curve = stage_reward_curve(points.values(), "version")
    assert {p.key for p in curve} == {BASE, "policy@1"} and all(p.count + p.missing in (1, 2) for p in curve)


def test_bank_size_counts_items_and_never_raises(tmp_path: Path, bank: RubricBank) -> None:
    for q in ("Who wrote the novel Dracula?", "What is the capital city of France?"):
        bank.put(BankItem.new(question=q, rubrics="Critical Requirement: name it", takeaways="1. Search first.",
                              score=0.7, judge_model="judge-x", policy_version=BASE, session_id="s-1"))
    assert bank_size(bank) == 2
    assert bank_size(lambda: bank) == 2
    assert bank_size(None) is None
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the data folder should be")
    assert bank_size(lambda: RubricBank(StoreConfig(data_dir=blocked))) is None  # cannot be opened
    log = SessionLog(tmp_path / "other" / "rubricem.sqlite3")
    assert summary(Registry(log), log, lambda: RubricBank(StoreConfig(data_dir=blocked))).bank_size is None
