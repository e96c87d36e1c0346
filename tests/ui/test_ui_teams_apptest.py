"""The Teams page (issue 49) through Streamlit's AppTest on the real page and a real SQLite store: an admin creates a
team, assigns a person, shares it and is refused removing it while one of its sessions runs; a bad name is refused
with nothing written; a non-admin sees none of it. Every refusal reaches the page escaped (`md_literal`), as all
text does."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app.container import Services
from app.settings import Settings, UIConfig
from app.ui.view import md_literal
from store import PromptRecord
from store.config import StoreConfig
from store.people import SessionOwners
from store.registry import Registry
from store.session_log import SessionLog
from store.teams import Teams
from store.users import Users

TIMEOUT = 60


def _teams_script() -> None:
    from app.ui import teams_page

    teams_page.page()


@pytest.fixture
def log(tmp_path: Path, put_services: Callable[[Services, str | None], Services]) -> SessionLog:
    """A real store behind the page, with two people; no policy, index or bank (the page reads only the store)."""
    settings = Settings(store=StoreConfig(data_dir=tmp_path / "data"), ui=UIConfig())
    settings.store.data_dir.mkdir(parents=True, exist_ok=True)
    store = SessionLog(settings.store.sqlite_path)
    Users(store).add("alice", password="alice's long password")
    Users(store).add("bob", password="bob's long password")
    put_services(Services(settings, store, None, {}, None, None, None, Registry(store)),  # type: ignore[arg-type]
                 settings.ui.host)
    return store


def _page(role: str, user_id: str) -> AppTest:
    at = AppTest.from_function(_teams_script, default_timeout=TIMEOUT)
    at.session_state["role"] = role
    at.session_state["user_id"] = user_id
    return at.run()


def _cells(at: AppTest) -> list[dict[str, object]]:
    return at.dataframe[0].value.to_dict("records") if at.dataframe else []


def test_admin_creates_a_team_assigns_shares_and_removes_it(log: SessionLog) -> None:
    at = _page("admin", "local")
    assert not at.exception, at.exception
    assert any("No teams yet" in c.value for c in at.caption) and not at.dataframe

    at.text_input(key="team_new_name").input("Law & [x](https://evil.example/)").run()
    at.button(key="team_create").click().run()
    assert not at.exception and Teams(log).names() == []  # refused, nothing written
    (error,) = [str(e.value) for e in at.error]
    assert error.startswith(md_literal("a team name is 1-40 characters"))  # escaped, as all text on the page

    at.text_input(key="team_new_name").input("law").run()
    at.button(key="team_create").click().run()
    assert not at.exception, at.exception
    assert Teams(log).names() == ["law"]
    assert any("Created team law" in str(s.value) for s in at.success)
    assert _cells(at)[0]["team"] == "law" and _cells(at)[0]["live version"] == "global (base)"

    at.selectbox(key="team_person").set_value("alice").run()
    at.selectbox(key="team_assign_to").set_value("law").run()
    at.button(key="team_assign").click().run()
    assert not at.exception, at.exception
    assert Teams(log).team_of("alice") == "law" and Teams(log).team_of("bob") is None
    assert _cells(at)[0]["members"] == "alice" and _cells(at)[0]["shares with global"] == "off"

    at.toggle(key="team_share_law").set_value(True).run()
    assert not at.exception and Teams(log).get("law").share_global is True
    assert _cells(at)[0]["shares with global"] == "on"

    sid = log.create_session("q?", PromptRecord("p", (1,), "s"), {}, "base", owner="alice", source="chat")
    assert log.get(sid).team == "law"
    at.button(key="team_remove").click().run()
    assert not at.exception, at.exception
    assert any(md_literal("team 'law' has 1 running session(s)") in str(e.value) for e in at.error)
    assert Teams(log).get("law").members == ("alice",)  # refused: nothing changed

    log.finish(sid, "completed", report="r")
    at.button(key="team_remove").click().run()
    assert not at.exception, at.exception
    assert Teams(log).names() == [] and Teams(log).team_of("alice") is None
    assert log.get(sid).team == "law"  # its past session keeps its name

    at.selectbox(key="team_person").set_value("bob").run()
    assert at.button(key="team_unassign").disabled  # bob is in no team


def test_a_non_admin_sees_no_team_controls(log: SessionLog) -> None:
    Teams(log).add("law")
    Teams(log).assign("alice", "law")
    at = _page("user", "alice")
    assert not at.exception, at.exception
    assert [c.value for c in at.caption] == ["Teams are managed by admins."]
    assert not (at.dataframe or at.text_input or at.button or at.selectbox or at.toggle or at.checkbox)
    assert "bob" not in str(at) and "law" not in str(at)  # nothing of who is in which team


def test_the_page_says_what_sharing_does_to_the_reflections_and_the_store_does_it(log: SessionLog) -> None:
    """Issue 65: a team's sharing decides whose research the reflections written from its sessions guide, not only
    what trains the global policy, and the page says so, as the store applies it: sessions asked from then on, while
    it still shares (`SessionOwners.unshared_with`, the bank's filter for everyone but the team)."""
    Teams(log).add("law")
    Teams(log).assign("alice", "law")  # bob is in no team
    owners = SessionOwners(log)

    def asked() -> str:
        sid = log.create_session("q?", PromptRecord("p", (1,), "s"), {}, "base", owner="alice", source="chat")
        log.finish(sid, "completed", report="r")
        return sid

    at = _page("admin", "local")
    caption = " ".join(str(c.value) for c in at.caption)
    assert "the reflections written from them guide only its own people" in caption, caption
    assert "sessions it asks from then on train the global policy and guide everyone's research" in caption, caption
    toggle = at.toggle(key="team_share_law")
    assert "their reflections guide everyone's research" in toggle.label, toggle.label
    assert "the reflections written from them also guide the research of people outside the team" in toggle.help
    assert "Sessions asked before it shared stay the team's own" in toggle.help
    assert "Off, at once: none of its sessions trains the global policy, and their reflections guide only the " \
           "team's own members" in toggle.help
    assert at.checkbox(key="team_new_share").help == toggle.help  # the same words when a team is created

    before = asked()
    assert owners.unshared_with("bob", [before]) == {before} and owners.unshared_with("alice", [before]) == set()
    at.toggle(key="team_share_law").set_value(True).run()
    assert not at.exception, at.exception
    (notice,) = [str(s.value) for s in at.success]
    assert notice == md_literal("Team law shares: from now on its sessions also train the global policy and their "
                                "reflections also guide the research of people outside the team; earlier sessions "
                                "stay its own."), notice
    after = asked()
    assert owners.unshared_with("bob", [before, after]) == {before}  # from then on: the earlier one stays law's

    at.toggle(key="team_share_law").set_value(False).run()
    assert not at.exception, at.exception
    (notice,) = [str(s.value) for s in at.success]
    assert notice == md_literal("Team law no longer shares: none of its sessions trains the global policy, and their "
                                "reflections guide only its own members."), notice
    assert owners.unshared_with("bob", [before, after]) == {before, after}  # at once, the later one too
    assert owners.unshared_with("alice", [before, after]) == set()
