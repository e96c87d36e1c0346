"""Who a visitor is (issue 18): named accounts (bcrypt), the shared password as a one-user shortcut, OIDC by e-mail or
by subject when the provider sends no e-mail, and a refusal when it sends neither; named accounts make even a
loopback UI ask for a login."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from app.settings import UIConfig
from app.ui.auth import Identity, LoginRefused, access_policy, oidc_identity, password_login
from store import SessionLog
from store.users import Users


@pytest.fixture
def users(tmp_path: Path) -> Users:
    return Users(SessionLog(tmp_path / "log.sqlite3"))


def test_named_accounts_log_in_by_name_and_password(users: Users) -> None:
    users.add("alice", password="alice password")
    users.add("root", password="root password", role="admin")
    ui = UIConfig(password=SecretStr("shared-pw"))
    assert password_login("alice", "alice password", ui, users) == Identity("alice", "user")
    assert password_login(" root ", "root password", ui, users) == Identity("root", "admin")
    # Every failure is the same None: a wrong password, an unknown name, the shared password under a name.
    for name, given in (("alice", "root password"), ("nobody", "alice password"), ("alice", "shared-pw"),
                        ("alice", ""), ("alice", "a" * 200)):
        assert password_login(name, given, ui, users) is None
    assert password_login("", "shared-pw", ui, users) == Identity("local", "user")
    assert password_login("", "alice password", ui, users) is None


def test_named_accounts_make_a_loopback_ui_ask_who_you_are() -> None:
    assert not access_policy("127.0.0.1", UIConfig()).login_required
    policy = access_policy("127.0.0.1", UIConfig(), accounts=True)
    assert policy.login_required and policy.methods == ("password",)
    # Accounts are a login: an exposed UI with accounts and no shared password serves (the password form).
    assert access_policy("0.0.0.0", UIConfig(), accounts=True).methods == ("password",)


def test_oidc_identity_by_email_then_subject_and_refused_without_either() -> None:
    ui = UIConfig(oidc=True, admin_emails=["Boss@Example.org"])
    assert oidc_identity("Boss@example.ORG", "sub-1", ui) == Identity("boss@example.org", "admin")
    assert oidc_identity("boss@example.org", "sub-1", ui, email_verified=False) == Identity("boss@example.org", "user")
    # No e-mail claim: the subject identifies them, and they are never an admin (admins are listed by e-mail).
    assert oidc_identity(None, "2f1c-77", ui) == Identity("oidc:2f1c-77", "user")
    assert oidc_identity("  ", "2f1c-77", ui) == Identity("oidc:2f1c-77", "user")
    with pytest.raises(LoginRefused, match="neither an e-mail address nor a subject"):
        oidc_identity(None, None, ui)
