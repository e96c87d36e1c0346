"""The scheduler runs one retraining cycle per policy (the global one, then each team's) and says why a team with too
few sessions gets none; what a promotion must never unload. Team isolation in the cycle itself, fast (issue 65): what
each cycle hands to training, for a person who moved between teams, a team with nothing of its own, and a team that
opted in to share with the global policy late; and a team candidate is never promoted on the global gate alone.

A team's cycle itself runs end to end on the real vLLM in tests/app/test_vllm_teams.py: it trains on that team's
consenting sessions only, from the team's live version (the global one while it has none: `Registry.live(team)`), is
gated on the team's own questions and on the global probe set, and promotes and rolls back that team's alias only.
The registry's per-team windows, aliases and rollback to the global policy are tests/store/test_teams.py's. (An
embedded team cycle ran here too until 2026-12-05; it repeated the vLLM test's cycle at 80 s of the suite's time.)"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.config import SHIPPED_SFT_ADAPTER
from app.scheduler import scheduled_job
from app.settings import Settings
from learning.config import LearningConfig, RetrainConfig
from learning.evaluate import Probe
from learning.judge.offline import OfflineJudge
from learning.pipeline import CycleResult, NoTeamData, RetrainParts, retrain
from store import PromptRecord
from store.config import StoreConfig
from store.registry import Cycle, PolicyVersion, Registry
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


# --- team isolation in the cycle itself (issue 65) -------------------------------------------------------------------
# Real parts: the real cycle (`learning.pipeline.retrain`), registry and SQLite store, the real offline judge. Only the
# training step, the GPU part, is the test's: it records what the cycle hands it, then stops the cycle there (or
# hands back a finished adapter). Under either mutation below, these tests fail:
# (a) a team's window computed from its members of today instead of the team each session was asked in;
# (b) a team's cycle trained on the global window.

SEED = ["Who was Haymo of Faversham?", "Who directed The Prestige?"]  # the configured seed set
PROBES = ["What is Lilu in mythology?"]


class _StopAtTraining(Exception):
    """Raised by the test's training step once it has recorded what it was given."""


def _asked(log: SessionLog, owner: str, question: str) -> str:
    """A completed session of `owner`, in the team they are in now (as the service records it)."""
    sid = log.create_session(question, PromptRecord("p", (1,), "s"), {}, "base", owner=owner)
    log.finish(sid, "completed", report="r")
    return sid


def _parts(log: SessionLog, tmp_path: Path, train: Callable[..., object]) -> RetrainParts:
    """The cycle's parts on the real store and offline judge; `train` stands in for SS-GRPO."""

    async def probe_for(version: PolicyVersion) -> Probe:
        pytest.fail(f"the gate probed {version.name}: this cycle should have ended before its gate")

    async def activate(new: PolicyVersion, old: PolicyVersion) -> None:
        pytest.fail(f"{new.name} was activated")

    return RetrainParts(log=log, registry=Registry(log), judge=OfflineJudge(log), gate_judge=OfflineJudge(None),
                        train=train, probe_for=probe_for, activate=activate,  # type: ignore[arg-type]
                        adapters_dir=tmp_path / "adapters", probe_questions=PROBES, seed_questions=SEED)


def _trained_on(log: SessionLog, tmp_path: Path, team: str | None) -> list[str]:
    """The questions one cycle of `team` (None: the global policy) hands to training."""
    given: list[list[str]] = []

    async def train(cycle: Cycle, questions: list[str], live: PolicyVersion) -> Path:
        given.append(list(questions))
        raise _StopAtTraining

    with pytest.raises(_StopAtTraining):
        asyncio.run(retrain(_parts(log, tmp_path, train), RetrainConfig(), team=team))
    (questions,) = given
    return questions


def _teams_with_a_mover(log: SessionLog) -> dict[str, str]:
    """ann asks in law, then moves to bio and asks there; bob is in bio; cy is in no team. Returns each question's
    session id."""
    users, teams = Users(log), Teams(log)
    for name in ("ann", "bob", "cy"):
        users.add(name, password=f"{name}'s password", consent=True)
    teams.add("law")
    teams.add("bio")
    teams.assign("ann", "law")
    teams.assign("bob", "bio")
    asked = {"What is tort law?": _asked(log, "ann", "What is tort law?")}
    teams.assign("ann", "bio")  # moved: her law question stays law's
    for owner, question in (("ann", "What is a ribosome?"), ("bob", "What is a gene?"),
                            ("cy", "What is the capital of France?")):
        asked[question] = _asked(log, owner, question)
    return asked


def test_each_team_cycle_trains_on_the_sessions_asked_in_that_team_only(tmp_path: Path) -> None:
    log = SessionLog(tmp_path / "log.sqlite3")
    asked = _teams_with_a_mover(log)
    reg, end = Registry(log), log.now()
    # The windows (store.registry): each session counts for the team it was asked in, never its owner's of today.
    assert reg.sessions_in_window(None, end, team="law") == [asked["What is tort law?"]]
    assert reg.sessions_in_window(None, end, team="bio") == [asked["What is a ribosome?"], asked["What is a gene?"]]
    assert reg.sessions_in_window(None, end) == [asked["What is the capital of France?"]]
    # What each cycle trains on (learning.pipeline): its own window's questions, then the seed set.
    assert _trained_on(log, tmp_path, "law") == ["What is tort law?", *SEED]
    assert _trained_on(log, tmp_path, "bio") == ["What is a ribosome?", "What is a gene?", *SEED]
    assert _trained_on(log, tmp_path, None) == ["What is the capital of France?", *SEED]


def test_a_team_with_nothing_of_its_own_gets_no_cycle_and_is_told_why(tmp_path: Path) -> None:
    """`retrain --now --team chem` for a team whose people asked nothing in it trained a "team" version on the seed
    set (and on nothing of chem's) and promoted it on the general gate alone. It must train nothing and say why."""
    log = SessionLog(tmp_path / "log.sqlite3")
    _teams_with_a_mover(log)
    Users(log).add("dan", password="dan's password", consent=True)
    _asked(log, "dan", "What is an ester?")  # asked before dan joined chem: the global policy's
    Teams(log).add("chem")
    Teams(log).assign("dan", "chem")
    given: list[list[str]] = []

    async def train(cycle: Cycle, questions: list[str], live: PolicyVersion) -> Path:
        given.append(list(questions))
        raise _StopAtTraining

    with pytest.raises(NoTeamData, match=r"team chem has nothing of its own to train on: it has no completed "
                                         r"session.*never on the seed set alone.*rubricem retrain --now --team chem"):
        asyncio.run(retrain(_parts(log, tmp_path, train), RetrainConfig(), team="chem"))
    assert given == []  # nothing trained, and nothing registered for chem
    (cycle,) = Registry(log).cycles(limit=1)
    assert (cycle.team, cycle.status) == ("chem", "skipped") and "nothing of its own" in (cycle.error or "")
    assert [v.name for v in Registry(log).versions()] == ["base"]
    assert Registry(log).team_live("chem") is None  # still served the global policy


def test_the_command_says_a_team_has_nothing_to_train_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The same refusal through `rubricem retrain --now --team chem`: a failure exit and the reason."""
    from app.cli.main import main
    from tests.indexes import seed_passages

    settings = Settings(store=StoreConfig(data_dir=tmp_path / "data"))
    seed_passages(settings, titles=("Lilu (mythology)",))  # the operator's own corpus: no demo corpus to index
    log = SessionLog(settings.store.sqlite_path)
    Teams(log).add("chem")
    monkeypatch.setenv("RUBRICEM_STORE__DATA_DIR", str(settings.store.data_dir))
    assert main(["retrain", "--now", "--team", "chem"]) == 1
    err = capsys.readouterr().err
    assert "NoTeamData: team chem has nothing of its own to train on" in err, err
    assert [v.name for v in Registry(log).versions()] == ["base"]


def test_a_team_candidate_with_no_team_question_left_is_rejected_never_gated_on_the_global_set_alone(
        tmp_path: Path) -> None:
    """ann withdraws her consent while law's cycle trains on her question: the team half of the gate has nothing to
    ask. The candidate must be rejected, saying so, not promoted on the global probe set alone (the gate used to drop
    its team half silently when it had no team questions)."""
    log = SessionLog(tmp_path / "log.sqlite3")
    _teams_with_a_mover(log)

    async def train(cycle: Cycle, questions: list[str], live: PolicyVersion) -> Path:
        Users(log).set_consent("ann", False)  # meanwhile, in the app
        return Path(shutil.copytree(SHIPPED_SFT_ADAPTER, tmp_path / "trained"))  # a finished, sound adapter

    result: CycleResult = asyncio.run(retrain(_parts(log, tmp_path, train), RetrainConfig(), team="law"))
    assert result.cycle.status == "rejected" and result.gate is None, result.message
    assert "team law has no question of its own left in the cycle's window to gate on" in result.message
    candidate = Registry(log).get(result.candidate or "")
    assert candidate.status == "rejected" and candidate.team == "law"
    assert Registry(log).team_live("law") is None


def test_the_global_cycle_takes_a_teams_sessions_asked_while_it_shared_only(tmp_path: Path) -> None:
    """`share_global` is read as each session starts (issue 65): bio opting in later does not hand the global cycle
    what bob asked before; opting out again takes effect at once."""
    log = SessionLog(tmp_path / "log.sqlite3")
    _teams_with_a_mover(log)  # bio does not share
    Teams(log).set_share("bio", True)
    _asked(log, "bob", "What is a protein?")  # asked while bio shares
    assert _trained_on(log, tmp_path, None) == ["What is the capital of France?", "What is a protein?", *SEED]
    Teams(log).set_share("bio", False)
    assert _trained_on(log, tmp_path, None) == ["What is the capital of France?", *SEED]


def test_migration_0014_keeps_what_the_global_cycle_read_for_older_sessions(tmp_path: Path) -> None:
    """Sessions from before 0014 take their team's sharing as it is at the upgrade (what the global cycle read for
    them until then); sessions of no team have none."""
    import sqlite3

    from store.migrations import apply_migrations, load_migrations

    path = tmp_path / "log.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    apply_migrations(conn, tuple(m for m in load_migrations() if m.version < 14))
    conn.execute("INSERT INTO teams (name, share_global, live_version, created_at) VALUES ('bio', 1, NULL, 'x'), "
                 "('law', 0, NULL, 'x')")
    for sid, team in (("s-bio", "bio"), ("s-law", "law"), ("s-none", None)):
        conn.execute("INSERT INTO sessions (session_id, question, policy_version, options_json, prompt_text, "
                     "prompt_token_ids, prompt_sha, status, created_at, updated_at, finished_at, team) VALUES "
                     "(?, 'q?', 'base', '{}', 'p', X'01000000', 's', 'completed', 'x', 'x', 'x', ?)", (sid, team))
    assert apply_migrations(conn) == (14,)
    rows = dict(conn.execute("SELECT session_id, share_global FROM sessions").fetchall())
    conn.close()
    assert rows == {"s-bio": 1, "s-law": 0, "s-none": None}


@pytest.mark.parametrize("concurrent", [False, True])
def test_the_gate_runs_each_versions_probe_sessions_in_turn_or_all_at_once(tmp_path: Path, concurrent: bool) -> None:
    """A team's gate asks both question sets of both versions with each version's probe made once. One after
    another (an in-process engine serves whichever version was made last): every session of the candidate ends
    before live's probe is made. At once (`concurrent_probes`, vLLM pins each request): all eight sessions (two
    samples of each question) are under way together. The decision is the same either way."""
    from tests.judge.builders import trajectory

    log = SessionLog(tmp_path / "log.sqlite3")
    _people(log)
    _asked(log, "ann@law.example", "What is tort law?")
    events: list[str] = []
    running = 0
    most = 0

    async def probe_for(version: PolicyVersion) -> Probe:
        events.append(f"probe {version.name}")

        async def probe(question: str, seed: int) -> object:
            nonlocal running, most
            running += 1
            most = max(most, running)
            await asyncio.sleep(0.05)  # a session's requests: the others may run meanwhile
            running -= 1
            events.append(f"ran {version.name}: {question}")
            return trajectory(f"{version.name}-{seed}", question=question)

        return probe  # type: ignore[return-value]

    async def train(cycle: Cycle, questions: list[str], live: PolicyVersion) -> Path:
        return Path(shutil.copytree(SHIPPED_SFT_ADAPTER, tmp_path / "trained"))

    async def activate(new: PolicyVersion, old: PolicyVersion) -> None:
        events.append(f"activate {new.name}")

    parts = RetrainParts(log=log, registry=Registry(log), judge=OfflineJudge(log), gate_judge=OfflineJudge(None),
                         train=train, probe_for=probe_for, activate=activate, adapters_dir=tmp_path / "adapters",
                         probe_questions=PROBES, seed_questions=SEED, concurrent_probes=concurrent)
    result = asyncio.run(retrain(parts, RetrainConfig(tolerance=1.0, probe_samples=2), team="law"))
    assert result.gate is not None and result.gate.promote, result.message
    assert "team questions:" in result.gate.reason  # gated on the team's own questions and the global set
    candidate, live = result.candidate, "base"
    assert [e for e in events if e.startswith("probe")] == [f"probe {candidate}", f"probe {live}"]
    ran = [e for e in events if e.startswith("ran")]
    assert len(ran) == 2 * (len(PROBES) + 1) * 2  # each version: the global set and the team's question, twice
    if concurrent:
        assert most == len(ran)
    else:
        assert most == 1
        assert events.index(f"probe {live}") > max(i for i, e in enumerate(events) if e.startswith(f"ran {candidate}"))
