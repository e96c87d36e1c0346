"""`rubricem users ...` and `rubricem sessions list --user` as an admin runs them (in process through tests/cli.py,
two calls as a real subprocess; SQLite store in a temp data folder, a real embedded Chroma bank): accounts, consent,
per-user counts, delete-data with its registry mark, and bad input (an unknown user, an over-long password) with exit
code 2 and no secret in any output."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from store import PromptRecord, SessionLog, StoreConfig
from store.people import SessionOwners
from store.records import BankItem
from store.registry import Registry
from store.rubric_bank import RubricBank
from store.session_log import ReflectionCandidate
from store.teams import Teams
from store.users import Users
from tests.cli import CliResult, run_cli

ROOT = Path(__file__).resolve().parents[2]
PROMPT = PromptRecord(text="p", token_ids=(1,), prompt_sha="s")
BOB = "oidc:0123456789ab:bob-subject"  # an OIDC id as the UI makes it (app.ui.auth.oidc_user_id)


def rubricem(args: list[str], env: dict[str, str], stdin: str = "") -> CliResult:
    """In process (tests/cli.py): the same entry point as the console script, without a Python start per call."""
    return run_cli(args, env, stdin)


def rubricem_process(args: list[str], env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    """The real console run, kept for the first test: the module entry point, its exit code and streams."""
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          input=stdin, timeout=300)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("RUBRICEM_")}
    e.update({"RUBRICEM_STORE__DATA_DIR": str(tmp_path / "data"), "HF_HUB_OFFLINE": "1"})
    return e


def test_accounts_consent_and_counts(env: dict[str, str], tmp_path: Path) -> None:
    added = rubricem_process(["users", "add", "alice", "--password-stdin", "--consent", "no"], env,
                             "alice's secret pw\n")
    assert added.returncode == 0, added.stderr
    assert "added alice (password, user)" in added.stdout and "secret" not in added.stdout + added.stderr
    assert rubricem(["users", "add", BOB, "--oidc", "--admin"], env).returncode == 0
    # Issue 34: OIDC people are known by issuer and subject, and no password account looks like an address.
    by_mail = rubricem(["users", "add", "bob@example.org", "--oidc"], env)
    assert by_mail.returncode == 2 and "not an OIDC id" in by_mail.stderr
    assert "RUBRICEM_UI__ADMIN_EMAILS" in by_mail.stderr
    at_name = rubricem(["users", "add", "carol@example.org", "--password-stdin"], env, "carol's long pw\n")
    assert at_name.returncode == 2 and "no '@'" in at_name.stderr
    taken = rubricem(["users", "add", "alice", "--password-stdin"], env, "another long pw\n")
    assert taken.returncode == 2 and "already exists" in taken.stderr
    too_long = rubricem_process(["users", "add", "carol", "--password-stdin"], env, "x" * 73 + "\n")
    assert too_long.returncode == 2 and "at most 72 bytes" in too_long.stderr and "x" * 73 not in too_long.stderr
    with SessionLog(tmp_path / "data" / "rubricem.sqlite3") as log:
        for owner in ("alice", "alice", BOB):
            sid = log.create_session("q?", PROMPT, {}, "base", owner=owner, source="chat")
            log.finish(sid, "completed", report="r")
        assert Users(log).verify_password("alice", "alice's secret pw") is not None
    listed = rubricem(["users", "list"], env).stdout.splitlines()
    assert listed[0].split()[:3] == ["alice", "password", "user"] and "learn: no" in listed[0]
    assert "sessions: 2" in listed[0] and "learn: default (yes)" in listed[1]
    counts = rubricem(["sessions", "list", "--user"], env).stdout.splitlines()
    assert [c.split()[:2] for c in counts] == [["alice", "2"], [BOB, "1"]]
    mine = rubricem(["sessions", "list", "--user", BOB], env).stdout.splitlines()
    assert len(mine) == 1
    assert "learn from their sessions: yes" in rubricem(["users", "set-consent", "alice", "yes"], env).stdout
    unknown = rubricem(["users", "set-consent", "mallory", "no"], env)
    assert unknown.returncode == 2 and unknown.stderr.strip() == "error: no user 'mallory'"
    assert rubricem(["users", "remove", "mallory"], env).returncode == 2
    assert rubricem(["users", "remove", "alice"], env).returncode == 0
    assert rubricem(["users", "list"], env).stdout.split()[0] == BOB


def test_delete_data_removes_rows_and_bank_items_and_marks_versions(env: dict[str, str], tmp_path: Path) -> None:
    data = tmp_path / "data"
    with SessionLog(data / "rubricem.sqlite3") as log:
        Users(log).add("dave", password="dave's password")
        sid = log.create_session("dave's question QX-99?", PROMPT, {}, "base", owner="dave", source="chat")
        log.finish(sid, "completed", report="r")
        log.record_judgement(sid, "judge", {"stages": {}})
        batch = log.record_reflection_batch(sid, [ReflectionCandidate(
            index=0, text="<reflection_rubrics>r</reflection_rubrics><reflection_takeaways>t</reflection_takeaways>",
            token_ids=(1,), policy_version="base", valid=True, u=0.9)], prompt=PROMPT, judge_model="offline",
            temperature=0.7, max_tokens=8)
        item = BankItem.new(question="dave's question QX-99?", rubrics="r", takeaways="t", score=0.9,
                            judge_model="offline", policy_version="base", session_id=sid)
        bank = RubricBank(StoreConfig(data_dir=data))
        bank.put(item)
        log.mark_reflection_accepted(batch, 0, item.id)
        adapter = tmp_path / "adapter"
        adapter.mkdir()
        (adapter / "adapter_config.json").write_text("{}")
        version = Registry(log).register(adapter, parent="base", data_window={"start": None, "end": log.now()})
    del bank
    refused = rubricem(["users", "delete-data", "dave"], env)
    assert refused.returncode == 2 and "--yes" in refused.stderr
    done = rubricem(["users", "delete-data", "dave", "--yes"], env)
    assert done.returncode == 0, done.stderr
    assert "1 sessions" in done.stdout and "1 rubric-bank item(s) removed" in done.stdout
    assert version.name in done.stdout and "QX-99" not in done.stdout
    assert f"{version.name}" in rubricem(["versions"], env).stdout.split("trained on data deleted later")[0]
    assert "dave" not in rubricem(["users", "list"], env).stdout
    assert RubricBank(StoreConfig(data_dir=data)).count() == 0
    again = rubricem(["users", "delete-data", "dave", "--yes"], env)
    assert again.returncode == 2 and again.stderr.strip() == "error: no user 'dave'"


def test_no_account_name_is_local_or_mcp_in_other_letters(env: dict[str, str], tmp_path: Path) -> None:
    """Issue 46, item 10: `local` (the operator) and `mcp` (the MCP identity) were refused as account names only as
    written in lower case, so `Local` or `MCP` made an account that reads as the operator's or the MCP's in every
    list of owners and every history filter."""
    for name in ("Local", "LOCAL", "MCP", "Mcp"):
        added = rubricem(["users", "add", name, "--password-stdin", "--admin"], env, "a long enough pw\n")
        assert added.returncode == 2 and "other than 'local' and 'mcp'" in added.stderr, (name, added.stderr)
    with SessionLog(tmp_path / "data" / "rubricem.sqlite3") as log:
        assert [u.user_id for u in Users(log).list() if u.kind == "password"] == []


def _open(tmp_path: Path) -> SessionLog:
    return SessionLog(tmp_path / "data" / "rubricem.sqlite3")


def test_teams_add_list_assign_share_promote_and_remove(env: dict[str, str], tmp_path: Path) -> None:
    """Issue 49: `rubricem users team ...` as the operator runs it; bad input is exit 2 with the store's words and
    nothing written, and a team whose session is running cannot be removed."""
    with _open(tmp_path) as log:
        Users(log).add("alice", password="alice's long password")
        Users(log).add(BOB, kind="oidc")
    assert rubricem(["users", "team", "list"], env).stdout.strip() == "no teams: everyone is served the global policy"
    added = rubricem(["users", "team", "add", "law"], env)
    assert added.returncode == 0, added.stderr
    assert "added team law (share with the global policy: off" in added.stdout
    assert rubricem(["users", "team", "add", "research", "--share"], env).returncode == 0
    for bad in ("Law", "x" * 41, "team:law@1"):
        refused = rubricem(["users", "team", "add", bad], env)
        assert refused.returncode == 2 and "a team name is 1-40 characters" in refused.stderr, (bad, refused.stderr)
        assert "Traceback" not in refused.stderr
    taken = rubricem(["users", "team", "add", "law"], env)
    assert taken.returncode == 2 and taken.stderr.strip() == "error: team 'law' already exists"
    with _open(tmp_path) as log:
        assert Teams(log).names() == ["law", "research"]  # the bad names wrote nothing

    assert rubricem(["users", "team", "assign", "alice", "law"], env).returncode == 0
    assert rubricem(["users", "team", "assign", BOB, "law"], env).returncode == 0
    nobody = rubricem(["users", "team", "assign", "mallory", "law"], env)
    assert nobody.returncode == 2 and nobody.stderr.strip() == "error: no user 'mallory'"
    nowhere = rubricem(["users", "team", "assign", "alice", "nope"], env)
    assert nowhere.returncode == 2 and nowhere.stderr.strip() == "error: no team 'nope'"
    gone = rubricem(["users", "team", "unassign", "mallory"], env)
    assert gone.returncode == 2 and gone.stderr.strip() == "error: no user 'mallory'"
    law, research = rubricem(["users", "team", "list"], env).stdout.splitlines()
    assert law.split()[0] == "law" and f"members: 2 (alice, {BOB})" in law
    assert "share: off" in law and law.endswith("live: global (base)")
    assert research.split()[0] == "research" and "members: 0 (-)" in research and "share: on" in research
    people = rubricem(["users", "list"], env).stdout.splitlines()
    assert people[0].startswith("alice") and people[0].endswith("team: law")

    assert rubricem(["users", "team", "share", "law", "on"], env).stdout.startswith("team law: sharing on: ")
    assert rubricem(["users", "team", "share", "research", "off"], env).returncode == 0
    assert rubricem(["users", "team", "share", "nope", "on"], env).returncode == 2
    with _open(tmp_path) as log:
        assert (Teams(log).get("law").share_global, Teams(log).get("research").share_global) == (True, False)
        adapter = tmp_path / "adapter"
        adapter.mkdir()
        (adapter / "adapter_config.json").write_text("{}")
        registry = Registry(log)
        version = registry.register(adapter, parent="base", team="law")
        registry.promote(version.name)
    law, research = rubricem(["users", "team", "list"], env).stdout.splitlines()
    assert law.endswith("live: team:law@1") and research.endswith("live: global (base)")

    assert rubricem(["users", "team", "unassign", BOB], env).returncode == 0
    with _open(tmp_path) as log:
        assert Teams(log).team_of(BOB) is None
        sid = log.create_session("q?", PROMPT, {}, "base", owner="alice", source="chat")
        assert log.get(sid).team == "law"  # stamped from the owner's team as the session starts
    running = rubricem(["users", "team", "remove", "law"], env)
    assert running.returncode == 2
    assert running.stderr.strip() == ("error: team 'law' has 1 running session(s); remove it when they have "
                                      "ended")
    with _open(tmp_path) as log:
        assert Teams(log).get("law").members == ("alice",)  # nothing changed
        log.finish(sid, "completed", report="r")
    removed = rubricem(["users", "team", "remove", "law"], env)
    assert removed.returncode == 0, removed.stderr
    assert "1 member(s) are back on the global policy" in removed.stdout
    with _open(tmp_path) as log:
        assert Teams(log).names() == ["research"] and Teams(log).team_of("alice") is None
        assert log.get(sid).team == "law"  # its past sessions keep its name
        assert Registry(log).get(version.name).team == "law"  # its versions stay in the registry
    again = rubricem(["users", "team", "remove", "law"], env)
    assert again.returncode == 2 and again.stderr.strip() == "error: no team 'law'"


def test_team_sharing_says_it_shares_the_reflections_too_as_the_store_does(env: dict[str, str], tmp_path: Path) -> None:
    """Issue 65: a team's sharing decides whose research the reflections written from its sessions guide, not only
    what trains the global policy; the help and the command's answer say so, as the store applies it: sessions asked
    from then on, while the team still shares (`SessionOwners.unshared_with`, the bank's filter)."""

    def said(args: list[str]) -> str:
        result = rubricem(args, env)
        assert result.returncode == 0, result.stderr
        return " ".join(result.stdout.split())  # argparse wraps help to the terminal's width

    assert ("teams: each team's policy learns only from its own people's sessions, and the reflections written from "
            "them guide only its own people, unless the team shares") in said(["users", "--help"])
    assert ("share from the start: its sessions also train the global policy, and the reflections written from them "
            "also guide people outside the team") in said(["users", "team", "add", "--help"])
    assert ("on: the sessions the team asks from then on also train the global policy, and the reflections written "
            "from them also guide the research of people outside the team (as strategy text, never their "
            "questions); off: at once, none of its sessions does either, earlier ones included") in said(
        ["users", "team", "--help"])

    with _open(tmp_path) as log:
        Users(log).add("alice", password="alice's long password")
        Users(log).add("bob", password="bob's long password")  # in no team
        Teams(log).add("law")
        Teams(log).assign("alice", "law")
        before = log.create_session("q?", PROMPT, {}, "base", owner="alice", source="chat")
        assert SessionOwners(log).unshared_with("bob", [before]) == {before}
    assert said(["users", "team", "share", "law", "on"]) == (
        "team law: sharing on: the sessions its people ask from now on also train the global policy, and the "
        "reflections written from them also guide the research of people outside the team (as strategy text, never "
        "their questions); sessions asked before stay the team's own")
    with _open(tmp_path) as log:
        after = log.create_session("q?", PROMPT, {}, "base", owner="alice", source="chat")
        assert SessionOwners(log).unshared_with("bob", [before, after]) == {before}
    assert said(["users", "team", "share", "law", "off"]) == (
        "team law: sharing off: at once, none of its sessions trains the global policy any more, and the reflections "
        "written from them guide only the team's own members")
    with _open(tmp_path) as log:
        assert SessionOwners(log).unshared_with("bob", [before, after]) == {before, after}
        assert SessionOwners(log).unshared_with("alice", [before, after]) == set()


def test_a_person_moved_between_teams_keeps_their_past_sessions_team(env: dict[str, str], tmp_path: Path) -> None:
    """A session records its owner's team when it starts; moving the person later never moves it (so the team that
    trained on it, or will, stays the one it was asked in)."""
    with _open(tmp_path) as log:
        Users(log).add("alice", password="alice's long password")
    for team in ("law", "med"):
        assert rubricem(["users", "team", "add", team], env).returncode == 0
    sessions: dict[str, str] = {}
    for step, cmd in (("law", ["assign", "alice", "law"]), ("med", ["assign", "alice", "med"]),
                      ("none", ["unassign", "alice"])):
        moved = rubricem(["users", "team", *cmd], env)
        assert moved.returncode == 0, moved.stderr
        with _open(tmp_path) as log:
            sessions[step] = log.create_session(f"{step}?", PROMPT, {}, "base", owner="alice", source="chat")
            log.finish(sessions[step], "completed", report="r")
    assert "(was: med)" in moved.stdout
    with _open(tmp_path) as log:
        assert {step: log.get(sid).team for step, sid in sessions.items()} == {"law": "law", "med": "med",
                                                                               "none": None}
