"""The scheduler runs one retraining cycle per policy (the global one, then each team's) and says why a team with too
few sessions gets none; what a promotion must never unload.

A team's cycle itself runs end to end on the real vLLM in tests/app/test_vllm_teams.py: it trains on that team's
consenting sessions only, from the team's live version (the global one while it has none: `Registry.live(team)`), is
gated on the team's own questions and on the global probe set, and promotes and rolls back that team's alias only.
The registry's per-team windows, aliases and rollback to the global policy are tests/store/test_teams.py's. (An
embedded team cycle ran here too until 2026-12-05; it repeated the vLLM test's cycle at 80 s of the suite's time.)"""

from __future__ import annotations

from pathlib import Path

from app.scheduler import scheduled_job
from app.settings import Settings
from learning.config import LearningConfig, RetrainConfig
from store.config import StoreConfig
from store.registry import Registry
from store.session_log import SessionLog
from store.teams import Teams
from store.users import Users


def _people(log: SessionLog) -> None:
    users, teams = Users(log), Teams(log)
    users.add("ann@law.example", kind="oidc", consent=True)
    users.add("bo@law.example", kind="oidc", consent=True)
    users.add("cy@example.org", kind="oidc", consent=True)  # no team: the global policy
    teams.add("law")
    teams.add("bio")  # no sessions at all
    teams.assign("ann@law.example", "law")
    teams.assign("bo@law.example", "law")


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
