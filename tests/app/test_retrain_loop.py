"""The online loop end to end on CPU with the embedded default: sessions → retrain cycle → promoted version answers
the next question → a broken candidate is rejected → rollback; plus the gate's decision rule and the cycle lock."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
import torch

from agent.config import AgentConfig, RunOptions, StageTokenCaps
from app.scheduler import CycleLocked, cycle_lock, run_cycle
from app.settings import Settings
from learning.config import LearningConfig, RetrainConfig
from learning.evaluate import VersionScore, decide
from store.config import StoreConfig
from store.registry import Registry
from store.session_log import SessionLog
from tests.gate import assert_gate_decided
from tests.indexes import seed_passages

SMALL = RunOptions(format="short_form", max_tool_calls=1, temperature=0.7, seed=1, wall_clock_s=600,
                   token_caps=StageTokenCaps(plan=24, research=16, review=16, answer=24), context_tokens=4096)


def _settings(tmp_path: Path, smollm2_dir: Path, probes: Path) -> Settings:
    """The loop test's settings: one training step cannot make a candidate measurably better than live, so its gate
    runs with tolerance 1.0 (the flow under test is promote → serve → reject → rollback); the gate's decision on real,
    measurably different versions at the default tolerance is test_the_real_gate_promotes_a_better_candidate_...."""
    retrain = RetrainConfig(steps=1, rollouts=2, batch_questions=1, max_token_caps=16, probe_questions=probes,
                            probe_samples=1, tolerance=1.0,  # why: see the docstring
                            min_new_sessions=2, unload_grace_s=0)
    settings = Settings(agent=AgentConfig(embedded_model_path=smollm2_dir, defaults=SMALL, local_search_k=2,
                                          snippet_chars=300),  # short tool outputs: the flow is under test
                        store=StoreConfig(data_dir=tmp_path / "data"), learning=LearningConfig(retrain=retrain))
    seed_passages(settings)
    return settings


def test_the_gate_promotes_within_tolerance_and_rejects_worse_or_failing_candidates() -> None:
    def score(total: float, failed: int = 0) -> VersionScore:
        return VersionScore("v", {}, total, 4, failed)

    assert decide(score(0.50), score(0.51), 0.02, "j").promote
    worse = decide(score(0.40), score(0.51), 0.02, "j")
    assert not worse.promote and "< live" in worse.reason
    assert not decide(score(0.9, failed=1), score(0.5), 0.02, "j").promote
    assert not decide(score(float("nan")), score(0.5), 0.02, "j").promote


@pytest.mark.slow
@pytest.mark.timeout(1200)  # about 2.5 minutes on an idle 2-core machine
def test_the_real_gate_promotes_a_better_candidate_and_rejects_a_worse_one(smollm2_dir: Path, tmp_path: Path) -> None:
    """The gate's own parts (the cycle's probe runs, its held-out offline judge, `score_version`, `decide` at the
    default tolerance) on two versions whose quality really differs: the shipped SFT adapter writes the scaffold,
    the plain base model does not (measured on two probe questions: totals 0.76 and 0.19). Better is promoted, worse
    is rejected, whichever of the two is live."""
    from agent.config import SHIPPED_SFT_ADAPTER
    from app.retrain import RetrainApp
    from learning.evaluate import score_version
    from store.registry import PolicyVersion

    probes = tmp_path / "probes.txt"
    probes.write_text("Who was Haymo of Faversham?\n")
    retrain = RetrainConfig(probe_questions=probes, probe_samples=1, max_token_caps=256)
    settings = Settings(agent=AgentConfig(embedded_model_path=smollm2_dir), store=StoreConfig(data_dir=tmp_path / "d"),
                        learning=LearningConfig(retrain=retrain))
    assert retrain.tolerance == 0.02  # the default, not a tolerance that lets anything through

    def version(name: str, adapter: Path | None) -> PolicyVersion:
        return PolicyVersion(name, 0, str(adapter) if adapter else None, None, "", {}, None, "live", None, "")

    async def scores() -> tuple[VersionScore, VersionScore]:
        app = RetrainApp(settings)
        try:
            parts = app.parts()
            out = []
            for v in (version("base", None), version("sft", SHIPPED_SFT_ADAPTER)):
                probe = await parts.probe_for(v)
                out.append(await score_version(v.name, probe, parts.gate_judge, parts.probe_questions, 1, 20261123))
            return out[0], out[1]
        finally:
            await app.aclose()

    base, sft = asyncio.run(scores())
    assert base.runs == sft.runs == 1 and base.failed_runs == sft.failed_runs == 0
    assert sft.total > base.total + 0.2, (sft, base)  # measurably better, not within noise of the tolerance
    promoted = decide(sft, base, retrain.tolerance, "offline")
    rejected = decide(base, sft, retrain.tolerance, "offline")
    assert promoted.promote and ">= live" in promoted.reason
    assert not rejected.promote and "< live" in rejected.reason


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_only_one_cycle_runs_at_a_time_across_processes(tmp_path: Path, backend: str,
                                                        request: pytest.FixtureRequest) -> None:
    """The file lock for a SQLite store; with a PostgreSQL store the advisory lock, which schedulers on other hosts
    share (a second process here stands for a second host: it shares nothing with this one but the server)."""
    import os
    import subprocess
    import sys
    import time

    url = request.getfixturevalue("postgres_url") if backend == "postgresql" else ""
    store = StoreConfig(data_dir=tmp_path, database_url=url or None)
    env = {**os.environ, "RUBRICEM_STORE__DATA_DIR": str(tmp_path), "RUBRICEM_STORE__DATABASE_URL": url}
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path.insert(0, '.'); from app.scheduler import cycle_lock\n"
        "from app.settings import Settings\n"
        "with cycle_lock(Settings().store):\n    print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2], env=env)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(CycleLocked), cycle_lock(store):
            pass
    finally:
        holder.kill()  # SIGKILL: the holder crashes without releasing anything itself
        holder.wait()
    for _ in range(300):  # released when the holder died (the server notices the closed socket at once, or nearly)
        try:
            with cycle_lock(store):
                break
        except CycleLocked:
            time.sleep(0.1)
    else:
        pytest.fail("the cycle lock of a killed holder was never released")


YES = ("Who was Haymo of Faversham?", "What is the Franciscan order?")
NO = "Where was the PRIVATE-NO-7 abbey built?"


@pytest.mark.slow
@pytest.mark.timeout(1800)  # about 4 minutes on an idle 2-core machine; much longer when the cores are shared
def test_sessions_retrain_promote_answer_reject_and_rollback(smollm2_dir: Path, tmp_path: Path) -> None:
    """Also consent: one person consents and one does not; only the consenting person's sessions are judged and
    trained on (the cycle's data window, its training questions file and its numbers say so)."""
    from app.container import build
    from store.owner import acting_as
    from store.users import Users

    probes = tmp_path / "probes.txt"
    probes.write_text("Who was Haymo of Faversham?\n")
    settings = _settings(tmp_path, smollm2_dir, probes)
    log = SessionLog(settings.store.sqlite_path)
    Users(log).add("yes@example.org", kind="oidc", consent=True)
    Users(log).add("no@example.org", kind="oidc", consent=False)

    async def ask(question: str) -> str:
        services = build(settings)
        try:
            out = await services.research.run(question, SMALL)
            return out.session_id
        finally:
            await services.policy.aclose()

    async def ask_as_people() -> dict[str, str]:
        services = build(settings)
        owners = {}
        try:
            for who, question, options in [("yes@example.org", q, SMALL) for q in YES] + [
                    ("no@example.org", NO, SMALL.model_copy(update={"max_tool_calls": 0}))]:
                with acting_as(who):  # as the chat page does: the session is created for this person
                    out = await services.research.run(question, options, source="chat")
                owners[out.session_id] = who
            return owners
        finally:
            await services.policy.aclose()

    owners = asyncio.run(ask_as_people())
    assert {sid: log.get(sid).owner for sid in owners} == owners  # the owner reached the store through the service
    result = asyncio.run(run_cycle(settings, trigger="cli", force=True))
    assert result.cycle.status == "promoted", result.message
    reg = Registry(SessionLog(settings.store.sqlite_path))
    assert_gate_decided(reg, result.cycle, tolerance=1.0)  # the wide tolerance still decides from recorded scores
    live = reg.live()
    assert live.name == "policy@1" and live.parent == "base" and live.eval_report is not None
    cycle = result.cycle
    assert cycle.numbers["new_sessions"] == 2 and cycle.numbers["judged"] == 2
    assert cycle.numbers["skipped_sessions"] == 1  # the refusing person's session
    window = reg.sessions_in_window(cycle.window_start, cycle.window_end)
    assert sorted(window) == sorted(s for s, who in owners.items() if who == "yes@example.org")
    trained_on = [json.loads(line)["question"] for line in
                  (settings.store.data_dir / "runs" / cycle.cycle_id / "questions.jsonl").read_text().splitlines()]
    assert trained_on == list(YES)
    assert live.data_window["sessions"] == 2  # type: ignore[index]
    for sid, who in owners.items():  # the refusing person's session was never judged either
        assert bool(log.judgements(sid)) == (who == "yes@example.org")
    assert not any(owners.get(s) == "no@example.org" for s in log.sessions_without_reflection())

    sid = asyncio.run(ask("Who founded the Franciscan order?"))  # the next question is answered by the new version
    rec = SessionLog(settings.store.sqlite_path).get(sid)
    assert rec.policy_version == "policy@1"
    assert {t.policy_version for t in rec.trajectory.turns if t.kind == "sampled"} == {"policy@1"}

    # A candidate with NaN weights is rejected; live stays where it was.
    broken = tmp_path / "broken"
    shutil.copytree(live.adapter_path, broken)  # type: ignore[arg-type]
    from safetensors.torch import load_file, save_file

    weights = load_file(str(broken / "adapter_model.safetensors"))
    save_file({k: torch.full_like(v, float("nan")) for k, v in weights.items()}, str(broken / "adapter_model.safetensors"))

    from app.retrain import RetrainApp
    from learning.pipeline import retrain

    async def broken_cycle() -> object:
        app = RetrainApp(settings)
        parts = app.parts()
        parts.seed_questions = ["q one?", "q two?"]  # no new sessions are needed for a forced cycle

        async def train(*_a: object) -> Path:
            return broken

        parts.train = train  # type: ignore[assignment]
        try:
            return await retrain(parts, settings.learning.retrain, force=True)
        finally:
            await app.aclose()

    rejected = asyncio.run(broken_cycle())
    assert rejected.cycle.status == "rejected" and "non-finite" in rejected.message  # type: ignore[attr-defined]
    assert reg.live().name == "policy@1" and reg.get("policy@2").status == "rejected"

    assert reg.rollback("test").version == "base"
    sid = asyncio.run(ask("Who was Haymo of Faversham?"))
    assert SessionLog(settings.store.sqlite_path).get(sid).policy_version == "base"


def test_the_scheduler_runs_on_its_trigger_and_records_a_skip_without_enough_sessions(tmp_path: Path) -> None:
    from apscheduler.triggers.cron import CronTrigger
    from apscheduler.triggers.interval import IntervalTrigger

    from app.scheduler import build_scheduler, scheduled_job

    settings = Settings(store=StoreConfig(data_dir=tmp_path / "data"),
                        learning=LearningConfig(retrain=RetrainConfig(min_new_sessions=3, interval_minutes=30)))
    job = build_scheduler(settings, blocking=False).get_job("retrain")
    assert isinstance(job.trigger, IntervalTrigger) and job.max_instances == 1
    cron = Settings(learning=LearningConfig(retrain=RetrainConfig(cron="15 2 * * *")))
    assert isinstance(build_scheduler(cron, blocking=False).get_job("retrain").trigger, CronTrigger)

    scheduled_job(settings)  # no sessions yet: recorded as skipped, nothing trained
    cycles = Registry(SessionLog(settings.store.sqlite_path)).cycles()
    assert [(c.trigger, c.status) for c in cycles] == [("scheduler", "skipped")]
    assert "0 new session(s) < min_new_sessions 3" in (cycles[0].error or "")


def test_a_second_promotion_while_one_is_in_progress_is_refused_with_the_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], smollm2_dir: Path) -> None:
    """`rubricem promote` and `rollback` hold the cycle lock while they move `live`: one that starts while another
    (or a retraining cycle) holds it is refused, says why, and moves nothing; once the first is done it goes through
    (its swap verified by the probe on the embedded engine, issue 63: so the versions are other weights than `base`,
    the shipped SFT adapter, which a version identical to it could not be told apart from)."""
    import os

    from agent.config import SHIPPED_SFT_ADAPTER
    from app.cli import main
    from tests.adapters import scaled_adapter

    for name in [n for n in os.environ if n.startswith("RUBRICEM_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RUBRICEM_STORE__DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("RUBRICEM_AGENT__EMBEDDED_MODEL_PATH", str(smollm2_dir))  # no second conversion
    monkeypatch.setenv("RUBRICEM_AGENT__EMBEDDED_ADAPTER_PATH", str(SHIPPED_SFT_ADAPTER))  # `base`, as by default
    store = StoreConfig(data_dir=tmp_path / "data")
    reg = Registry(SessionLog(store.sqlite_path))
    v1 = reg.register(scaled_adapter(SHIPPED_SFT_ADAPTER, tmp_path / "one", 0.5), parent="base")
    v2 = reg.register(scaled_adapter(SHIPPED_SFT_ADAPTER, tmp_path / "two", 2.0), parent="base")
    with cycle_lock(store):  # the first promotion, still moving `live`
        assert main(["promote", v2.name]) == 1
        assert "another retraining cycle or promotion is running" in capsys.readouterr().err
        assert main(["rollback"]) == 1
        assert reg.live().name == "base" and [c.version for c in reg.history(limit=10)] == ["base"]
    assert main(["promote", v1.name]) == 0 and reg.live().name == v1.name
