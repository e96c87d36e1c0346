"""Teams in the store (migration 0013, issue 49), on both backends: membership, the team a session keeps, each
policy's data window, team versions and aliases (promotion and rollback touch one team only), and deletion marks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from store import PromptRecord, SessionLog
from store.deletion import delete_user_data, versions_trained_on_deleted_data
from store.errors import InvalidInput
from store.migrations import apply_migrations, load_migrations
from store.registry import BASE, LIVE, Registry, RegistryError
from store.teams import TeamError, Teams, UnknownTeam
from store.users import UnknownUser, Users
from tests.store.conftest import StoreTarget, raw_connect


def adapter(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": 4}))
    return path


def session(log: SessionLog, owner: str, question: str, *, finish: bool = True) -> str:
    sid = log.create_session(question, PromptRecord("p", (1,), "s"), {}, "base", owner=owner)
    if finish:
        log.finish(sid, "completed", report="r")
    return sid


def people(log: SessionLog) -> None:
    users, teams = Users(log), Teams(log)
    for name in ("alice", "bob", "carol", "dave"):
        users.add(name, password=f"{name}'s password", consent=True)
    teams.add("law")
    teams.add("bio")
    teams.assign("alice", "law")
    teams.assign("bob", "bio")
    teams.assign("carol", "bio")  # dave has no team: the global policy


def test_migration_0013_leaves_old_sessions_and_people_without_a_team(store_target: StoreTarget) -> None:
    if store_target.sqlite_path is not None:
        store_target.sqlite_path.parent.mkdir(parents=True)
    with raw_connect(store_target) as conn:
        apply_migrations(conn, tuple(m for m in load_migrations() if m.version < 13))
        conn.execute("INSERT INTO users (user_id, kind, role, password_hash, consent, created_at) "
                     "VALUES ('old', 'local', 'user', NULL, 1, '2026-01-01T00:00:00+00:00')")
        assert apply_migrations(conn, tuple(m for m in load_migrations() if m.version <= 13)) == (13,)
    with store_target.open() as log:
        assert Users(log).get("old").team is None and Teams(log).list() == []
        assert Registry(log).live(None).name == BASE


def test_membership_names_and_the_team_a_session_keeps(store_target: StoreTarget) -> None:
    with store_target.open() as log:
        people(log)
        teams = Teams(log)
        assert teams.get("bio").members == ("bob", "carol") and Users(log).get("alice").team == "law"
        for bad in ("Law", "team:law", "a@b", "", "x" * 41, "-law"):
            with pytest.raises(InvalidInput, match="team name"):
                teams.add(bad)
        with pytest.raises(TeamError, match="already exists"):
            teams.add("law")
        with pytest.raises(UnknownTeam, match="no team 'chem'"):
            teams.assign("alice", "chem")
        with pytest.raises(UnknownUser):
            teams.assign("zoe", "law")
        assert teams.names() == ["bio", "law"]

        before = session(log, "alice", "what is tort law?")
        teams.assign("alice", "bio")  # moved: at most one team, and her past session stays with law
        after = session(log, "alice", "what is a ribosome?")
        assert (log.get(before).team, log.get(after).team) == ("law", "bio")
        assert teams.get("law").members == () and teams.team_of("alice") == "bio"
        teams.unassign("alice")
        assert teams.team_of("alice") is None and log.get(session(log, "alice", "q?")).team is None

        running = session(log, "bob", "still running?", finish=False)
        with pytest.raises(TeamError, match="1 running session"):
            teams.remove("bio")
        assert teams.get("bio").members == ("bob", "carol")  # nothing changed
        log.finish(running, "completed", report="r")
        cycle = Registry(log).start_cycle("cli", log.now(), team="bio")
        with pytest.raises(TeamError, match="cycle of team 'bio' is running"):
            teams.remove("bio")
        Registry(log).finish_cycle(cycle.cycle_id, "failed")
        teams.remove("bio")
        assert teams.names() == ["law"] and Users(log).get("bob").team is None
        assert log.get(running).team == "bio"  # history keeps the team
        with pytest.raises(TeamError, match="belonged to a removed team"):
            teams.add("bio")  # a new team would inherit its sessions and versions
        explicit = log.create_session("q?", PromptRecord("p", (1,), "s"), {}, "base", owner="dave", team="law")
        assert log.get(explicit).team == "law"  # the team that served it, as the service read it


def test_each_policy_trains_on_its_own_sessions_and_a_team_shares_only_when_it_opts_in(
        store_target: StoreTarget) -> None:
    with store_target.open() as log:
        people(log)
        reg = Registry(log)
        law = session(log, "alice", "law question?")
        bio = [session(log, "bob", "bio question 1?"), session(log, "carol", "bio question 2?")]
        solo = session(log, "dave", "general question?")
        Users(log).set_consent("carol", False)  # her sessions train nobody, not even her team
        end = log.now()
        assert reg.sessions_in_window(None, end, team="law") == [law]
        assert reg.sessions_in_window(None, end, team="bio") == [bio[0]]
        assert reg.skipped_in_window(None, end, team="bio") == 1
        assert reg.sessions_in_window(None, end) == [solo]  # no team shares yet
        Teams(log).set_share("bio", True)
        assert reg.sessions_in_window(None, end) == [solo]  # asked before bio shared: never handed over (issue 65)
        shared = session(log, "bob", "bio question 3?")
        assert reg.sessions_in_window(None, log.now()) == [solo, shared]

        # Windows are per policy: a finished law cycle does not move bio's or the global window.
        cycle = reg.start_cycle("cli", end, team="law")
        with pytest.raises(RegistryError, match="already running"):
            reg.start_cycle("cli", end, team="bio")
        reg.finish_cycle(cycle.cycle_id, "rejected")
        later = reg.start_cycle("cli", log.now(), team="bio")
        assert later.window_start is None and later.team == "bio"
        reg.finish_cycle(later.cycle_id, "rejected")
        again = reg.start_cycle("cli", log.now(), team="law")
        assert again.window_start == end
        reg.finish_cycle(again.cycle_id, "rejected")
        with pytest.raises(RegistryError, match="unknown team"):
            reg.start_cycle("cli", log.now(), team="chem")


def test_team_versions_promote_and_roll_back_only_their_team(store_target: StoreTarget, tmp_path: Path) -> None:
    with store_target.open() as log:
        people(log)
        reg = Registry(log)
        g1 = reg.register(adapter(tmp_path / "g1"), parent=BASE)
        reg.promote(g1.name)
        law1 = reg.register(adapter(tmp_path / "l1"), parent=g1.name, team="law")
        bio1 = reg.register(adapter(tmp_path / "b1"), parent=g1.name, team="bio")
        assert (law1.name, bio1.name, law1.team) == ("team:law@1", "team:bio@1", "law")
        with pytest.raises(InvalidInput, match="unknown team"):
            reg.register(adapter(tmp_path / "x"), parent=BASE, team="chem")
        assert reg.live("law").name == g1.name and reg.team_live("law") is None  # served the global one

        reg.promote(law1.name, "better on law questions")
        reg.promote(bio1.name)
        law2 = reg.register(adapter(tmp_path / "l2"), parent=law1.name, team="law")
        reg.promote(law2.name)
        assert (reg.live().name, reg.live("law").name, reg.live("bio").name) == (g1.name, law2.name, bio1.name)
        assert reg.current("law") == (law2.name, law2.adapter_path)

        assert reg.rollback_target("law") == reg.get(law1.name)
        back = reg.rollback("worse answers", team="law")
        assert (back.alias, back.version, back.previous, back.action) == ("team:law", law1.name, law2.name,
                                                                          "rollback")
        assert reg.live("bio").name == bio1.name and reg.live().name == g1.name  # nobody else moved
        assert reg.rollback_target("law") is None  # its first version: back to the global policy
        reg.rollback(team="law")
        assert reg.team_live("law") is None and reg.live("law").name == g1.name
        with pytest.raises(RegistryError, match="nothing to roll back"):
            reg.rollback(team="law")
        assert [h.version for h in reg.history(team="law")] == [LIVE, law1.name, law2.name, law1.name]
        assert [h.version for h in reg.history()][0] == g1.name  # the global history has no team moves

        reg.promote(g1.name)  # promoting a global version never touches a team's alias
        assert reg.live("bio").name == bio1.name


def test_deletion_marks_the_versions_of_the_team_that_trained_on_the_person(store_target: StoreTarget,
                                                                           tmp_path: Path) -> None:
    with store_target.open() as log:
        people(log)
        reg = Registry(log)
        start = log.now()
        session(log, "alice", "a law question?")
        end = log.now()
        window = {"start": start, "end": end}
        law1 = reg.register(adapter(tmp_path / "l1"), parent=BASE, team="law", data_window=window)
        law2 = reg.register(adapter(tmp_path / "l2"), parent=law1.name, team="law",
                            data_window={"start": end, "end": log.now()})
        bio1 = reg.register(adapter(tmp_path / "b1"), parent=BASE, team="bio", data_window=window)
        global1 = reg.register(adapter(tmp_path / "g1"), parent=BASE, data_window=window)

        result = delete_user_data(log, "alice", requested_by="root")

        # law1 trained on her session and law2 started from it; bio's window held her session's time but bio never
        # trains on law's sessions. The global window counts (law might have shared then): conservative.
        assert result.marked_versions == tuple(sorted((law1.name, law2.name, global1.name)))
        assert bio1.name not in versions_trained_on_deleted_data(log)
