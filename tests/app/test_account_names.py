"""Issue 65, findings 2 and 16, as the operator meets them in `rubricem users` (in process through tests/cli.py, one
call as a real subprocess without a terminal; a real SQLite store in a temp data folder):

- a removed name that owned data cannot be added again, and the error names `rubricem users set-password`;
- `users set-password` resets a password without removing the account, with the same rules as `users add`;
- a common password such as `12345678` is refused for a named account;
- no terminal and nothing on stdin (`docker compose exec -T`) is a clear error and exit 2, not an EOFError traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from store import PromptRecord, SessionLog
from store.users import Users
from tests.cli import CliResult, run_cli

ROOT = Path(__file__).resolve().parents[2]
PROMPT = PromptRecord(text="p", token_ids=(1,), prompt_sha="s")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("RUBRICEM_")}
    e.update({"RUBRICEM_STORE__DATA_DIR": str(tmp_path / "data"), "HF_HUB_OFFLINE": "1"})
    return e


def _open(tmp_path: Path) -> SessionLog:
    return SessionLog(tmp_path / "data" / "rubricem.sqlite3")


def _clean(result: CliResult | subprocess.CompletedProcess[str]) -> None:
    """Bad input is exit 2 with one `error:` line: no traceback, no password."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and "EOFError" not in result.stderr
    assert result.stderr.startswith("error: "), result.stderr


def test_a_removed_name_that_owned_data_is_not_added_again(env: dict[str, str], tmp_path: Path) -> None:
    assert run_cli(["users", "add", "alice", "--password-stdin"], env, "alice's long password\n").returncode == 0
    with _open(tmp_path) as log:
        sid = log.create_session("alice's private question?", PROMPT, {}, "base", owner="alice", source="chat")
        log.finish(sid, "completed", report="r")
    assert run_cli(["users", "remove", "alice"], env).returncode == 0
    again = run_cli(["users", "add", "alice", "--password-stdin"], env, "a brand new password\n")
    _clean(again)
    assert "owned data and has no account now" in again.stderr
    assert "rubricem users set-password alice" in again.stderr and "brand new" not in again.stderr
    for twin in ("Alice", "alice\u200b"):
        _clean(run_cli(["users", "add", twin, "--password-stdin"], env, "a brand new password\n"))
    with _open(tmp_path) as log:
        assert Users(log).list() == [] and log.get(sid).owner == "alice"


def test_set_password_resets_a_password_and_keeps_the_account(env: dict[str, str], tmp_path: Path) -> None:
    assert run_cli(["users", "add", "bob", "--password-stdin"], env, "bob's long password\n").returncode == 0
    with _open(tmp_path) as log:
        before = Users(log).login_key("bob")
    done = run_cli(["users", "set-password", "bob", "--password-stdin"], env, "bob's new password\n")
    assert done.returncode == 0, done.stderr
    assert "bob" in done.stdout and "signed out" in done.stdout and "bob's new" not in done.stdout + done.stderr
    with _open(tmp_path) as log:
        users = Users(log)
        assert users.verify_password("bob", "bob's new password") is not None
        assert users.verify_password("bob", "bob's long password") is None
        assert users.login_key("bob") != before
    common = run_cli(["users", "set-password", "bob", "--password-stdin"], env, "password123\n")
    _clean(common)
    assert "commonly used passwords" in common.stderr and "password123" not in common.stderr
    nobody = run_cli(["users", "set-password", "nobody", "--password-stdin"], env, "a long new password\n")
    _clean(nobody)
    assert nobody.stderr.strip() == "error: no user 'nobody'"


def test_12345678_is_refused_for_a_named_account(env: dict[str, str], tmp_path: Path) -> None:
    refused = run_cli(["users", "add", "carol", "--password-stdin"], env, "12345678\n")
    _clean(refused)
    assert "commonly used passwords" in refused.stderr and "12345678" not in refused.stderr + refused.stdout
    with _open(tmp_path) as log:
        assert Users(log).list() == []


def test_nothing_on_stdin_with_password_stdin_is_a_clear_error(env: dict[str, str], tmp_path: Path) -> None:
    with _open(tmp_path) as log:
        Users(log).add("erin", password="erin's long password")
    for action, name in (("add", "dave"), ("set-password", "erin")):
        empty = run_cli(["users", action, name, "--password-stdin"], env, "")
        _clean(empty)
        assert "nothing on stdin" in empty.stderr, empty.stderr


def test_no_terminal_and_nothing_on_stdin_is_a_clear_error(env: dict[str, str], tmp_path: Path) -> None:
    """As `docker compose exec -T app rubricem users add dave` runs it: a real process with no controlling terminal
    (a new session) and an empty stdin. It crashed with a raw EOFError traceback."""
    with _open(tmp_path) as log:
        Users(log).add("erin", password="erin's long password")
    for action, name in (("add", "dave"), ("set-password", "erin")):
        run = subprocess.run([sys.executable, "-m", "app.cli", "users", action, name], cwd=ROOT, env=env, text=True,
                             input="", capture_output=True, timeout=300, start_new_session=True)
        _clean(run)
        assert "no terminal" in run.stderr and "--password-stdin" in run.stderr, run.stderr
    with _open(tmp_path) as log:
        assert [u.user_id for u in Users(log).list()] == ["erin"]
        assert Users(log).verify_password("erin", "erin's long password") is not None
