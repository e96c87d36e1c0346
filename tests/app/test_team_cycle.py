"""A team's retraining cycle end to end on CPU (issue 49): it trains on that team's consenting sessions only, starts
from the global live version (the team has none yet), is gated on the team's own questions and on the global probe
set, and its promotion and rollback move that team's alias only. The scheduler runs one cycle per policy and says
why a team with too few sessions gets none.

Real parts: the embedded SmolLM2, real SS-GRPO training, the offline judge, the real registry and SQLite store."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agent.config import AgentConfig, RunOptions, StageTokenCaps
from app.scheduler import run_cycle, scheduled_job
from app.settings import Settings
from learning.config import LearningConfig, RetrainConfig
from store.config import StoreConfig
from store.owner import acting_as
from store.registry import BASE, Registry
from store.session_log import SessionLog
from store.teams import Teams
from store.users import Users
from tests.gate import assert_gate_decided
from tests.indexes import seed_passages

SMALL = RunOptions(format="short_form", max_tool_calls=1, temperature=0.7, seed=1, wall_clock_s=600,
                   token_caps=StageTokenCaps(plan=16, research=16, review=16, answer=16), context_tokens=4096)
LAW = ("Who was Haymo of Faversham?", "What is the Franciscan order?")
OTHER = "Where was the PRIVATE-GLOBAL-3 abbey built?"


def _settings(tmp_path: Path, smollm2_dir: Path, min_new: int) -> Settings:
    """As the global loop test's: a wide gate tolerance (one step cannot make a candidate measurably better; the
    decision rule on versions that really differ is test_retrain_loop's real-gate test)."""
    probes = tmp_path / "probes.txt"
    probes.write_text("Who founded the Franciscan order?\n")
    retrain = RetrainConfig(steps=1, rollouts=2, batch_questions=1, max_token_caps=16, probe_questions=probes,
                            probe_samples=1, tolerance=1.0, min_new_sessions=min_new, unload_grace_s=0)
    settings = Settings(agent=AgentConfig(embedded_model_path=smollm2_dir, defaults=SMALL, local_search_k=2,
                                          snippet_chars=300),
                        store=StoreConfig(data_dir=tmp_path / "data"), learning=LearningConfig(retrain=retrain))
    seed_passages(settings)
    return settings


def _people(log: SessionLog) -> None:
    users, teams = Users(log), Teams(log)
    users.add("ann@law.example", kind="oidc", consent=True)
    users.add("bo@law.example", kind="oidc", consent=True)
    users.add("cy@example.org", kind="oidc", consent=True)  # no team: the global policy
    teams.add("law")
    teams.add("bio")  # no sessions at all
    teams.assign("ann@law.example", "law")
    teams.assign("bo@law.example", "law")


@pytest.mark.slow
def test_a_team_cycle_trains_on_its_own_sessions_and_moves_only_its_alias(smollm2_dir: Path, tmp_path: Path) -> None:
    from app.container import build

    settings = _settings(tmp_path, smollm2_dir, min_new=2)
    log = SessionLog(settings.store.sqlite_path)
    _people(log)

    async def ask_all() -> dict[str, str]:
        services = build(settings)
        owners = {}
        try:
            for who, question in (("ann@law.example", LAW[0]), ("cy@example.org", OTHER),
                                  ("bo@law.example", LAW[1])):
                with acting_as(who):
                    out = await services.research.run(question, SMALL, source="chat")
                owners[out.session_id] = who
            return owners
        finally:
            await services.policy.aclose()

    owners = asyncio.run(ask_all())
    result = asyncio.run(run_cycle(settings, trigger="cli", force=True, team="law"))
    assert result.cycle.status == "promoted", result.message
    reg = Registry(SessionLog(settings.store.sqlite_path))
    report = assert_gate_decided(reg, result.cycle, tolerance=1.0)
    general = report["general"]  # the second gate: the global probe set, against what the team is served now
    assert general is not None and general["live"]["version"] == BASE and general["candidate"]["runs"] == 1
    assert "team questions:" in report["reason"] and "general questions:" in report["reason"]

    version = reg.get("team:law@1")
    assert version.team == "law" and version.parent == BASE  # started from the global live version
    assert reg.live("law").name == version.name and reg.live().name == BASE and reg.team_live("bio") is None
    cycle = result.cycle
    assert cycle.team == "law" and cycle.numbers["new_sessions"] == 2
    window = reg.sessions_in_window(cycle.window_start, cycle.window_end, team="law")
    assert sorted(window) == sorted(s for s, who in owners.items() if who.endswith("@law.example"))
    trained_on = [json.loads(line)["question"] for line in
                  (settings.store.data_dir / "runs" / cycle.cycle_id / "questions.jsonl").read_text().splitlines()]
    assert trained_on == list(LAW)  # never the global person's question

    # The global policy's window still holds the global person's session: the team's cycle did not consume it.
    assert reg.sessions_in_window(None, log.now()) == [s for s, who in owners.items() if who == "cy@example.org"]

    assert reg.rollback("test", team="law").version == "live"  # its first version: back to the global policy
    assert reg.live("law").name == BASE and reg.live().name == BASE


def test_the_scheduler_runs_a_cycle_per_policy_and_says_why_a_team_gets_none(tmp_path: Path) -> None:
    settings = Settings(store=StoreConfig(data_dir=tmp_path / "data"),
                        learning=LearningConfig(retrain=RetrainConfig(min_new_sessions=3, interval_minutes=30)))
    log = SessionLog(settings.store.sqlite_path)
    _people(log)
    scheduled_job(settings)  # no sessions yet: the global policy and both teams recorded as skipped, with why
    cycles = Registry(log).cycles()
    assert sorted((c.team or "", c.status) for c in cycles) == [("", "skipped"), ("bio", "skipped"),
                                                                  ("law", "skipped")]
    reasons = {c.team: c.error for c in cycles}
    assert reasons["law"] == "0 new session(s) (team law) < min_new_sessions 3"
    assert reasons[None] == "0 new session(s) < min_new_sessions 3"

    # What a promotion must never unload: every alias's version, and the version a session still runs on (one
    # paused for approval keeps it for hours).
    from app.retrain import live_names
    from store import PromptRecord

    running = log.create_session("q?", PromptRecord("p", (1,), "s"), {}, "team:law@7", owner="ann@law.example")
    assert live_names(Registry(log)) == {"base", "team:law@7"}
    log.finish(running, "failed", error="x")
    assert live_names(Registry(log)) == {"base"}
