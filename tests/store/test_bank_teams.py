"""Issue 65, finding 3: a team's reflections reach only its own members' prompts unless the team shares.

Real parts: the app's shared rubric bank (embedded Chroma) with owners and teams read from a real SQLite session log
(`store.people.SessionOwners`), teams and people made through `store.teams.Teams` and `store.users.Users`. Before,
every team's reflections were retrieved for everyone: a similar question from another team (or from someone in no
team) brought a law team's reflection into their prompt, as strategy text shaped by that team's question.
"""

from __future__ import annotations

from pathlib import Path

from store.config import StoreConfig
from store.owner import acting_as
from store.people import SessionOwners
from store.records import BankItem, PromptRecord
from store.rubric_bank import RubricBank
from store.session_log import SessionLog
from store.teams import Teams
from store.users import Users

LAW_Q = "How is a tenancy deposit protected under English law?"
ASKED = "How are tenancy deposits protected in England?"
FILLERS = ("How do you bake sourdough bread at home?", "How do glaciers carve a valley?",
           "Which rivers flow through Paris?")


def _reflect(log: SessionLog, bank: RubricBank, owner: str, question: str) -> BankItem:
    sid = log.create_session(question, PromptRecord("p", (1,), "s"), {}, "base", owner=owner, source="chat")
    log.finish(sid, "completed", report="r")
    item = BankItem.new(question=question, rubrics=f"RUBRIC-{owner}", takeaways="t", score=0.8, judge_model="judge",
                        policy_version="base", session_id=sid)
    bank.put(item)
    return item


def _reaches(bank: RubricBank, person: str, item: BankItem) -> bool:
    """Whether `item` is among what `person`'s research on ASKED would put into its prompt."""
    with acting_as(person):
        return item.id in bank.retrieve(ASKED, k=3, min_similarity=-1.0).item_ids


def test_a_teams_reflections_reach_only_its_members_unless_it_shares(tmp_path: Path) -> None:
    log = SessionLog(tmp_path / "s.sqlite3")
    users, teams = Users(log), Teams(log)
    for name in ("lena", "larry", "mo", "nina", "fran"):
        users.add(name, password=f"{name}-team-bank-passphrase-3")
    teams.add("law")
    teams.add("med")
    for person, team in (("lena", "law"), ("larry", "law"), ("mo", "med")):
        teams.assign(person, team)
    bank = RubricBank(StoreConfig(data_dir=tmp_path / "bank"), owners=SessionOwners(log))
    law = _reflect(log, bank, "lena", LAW_Q)  # asked in team law: the session records it
    assert log.get(law.session_id).team == "law"
    for q in FILLERS:
        _reflect(log, bank, "fran", q)  # no team: everyone's to use

    assert _reaches(bank, "larry", law)  # a teammate
    for outsider in ("mo", "nina", "local", "mcp"):  # another team, no team, the operator, the MCP identity
        assert not _reaches(bank, outsider, law), outsider
    with acting_as("mo"):  # the search still fills its slots from what mo may use
        assert len(bank.retrieve(ASKED, k=3, min_similarity=-1.0).hits) == 3  # the three fillers

    teams.set_share("law", True)  # the team opts in: what it asks from now on is everyone's to use ...
    assert not _reaches(bank, "mo", law)  # ... never what it asked before (sessions.share_global, migration 0014)
    shared = _reflect(log, bank, "lena", LAW_Q + " (asked while sharing)")
    assert all(_reaches(bank, p, shared) for p in ("larry", "mo", "nina", "local"))

    teams.set_share("law", False)  # opting out takes effect at once
    assert not _reaches(bank, "mo", shared) and _reaches(bank, "larry", shared)
    teams.unassign("larry")  # who may use them is read when asked: larry left, so no longer
    assert not _reaches(bank, "larry", law) and _reaches(bank, "lena", law)
    teams.remove("law")  # a removed team's reflections reach nobody else, its name never being reused
    assert not any(_reaches(bank, p, law) for p in ("larry", "mo", "nina"))
