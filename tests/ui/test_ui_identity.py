"""Who a visitor is (issues 18 and 34): named accounts (bcrypt), the shared passwords as their own identities
(`shared:user`, `shared:admin`; never `local`), OIDC by issuer and subject (the e-mail only when verified), and a
refusal when the provider sends no issuer or subject; named accounts make even a loopback UI ask for a login."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from app.settings import UIConfig
from app.ui.auth import Identity, LoginRefused, access_policy, oidc_identity, oidc_user_id, password_login
from store import SessionLog
from store.users import Users


@pytest.fixture
def users(tmp_path: Path) -> Users:
    return Users(SessionLog(tmp_path / "log.sqlite3"))


def test_named_accounts_log_in_by_name_and_password(users: Users) -> None:
    users.add("alice", password="alice password")
    users.add("root", password="root password", role="admin")
    ui = UIConfig(password=SecretStr("shared-password"), admin_password=SecretStr("shared-admin-pw"))
    assert password_login("alice", "alice password", ui, users) == Identity("alice", "user")
    assert password_login(" root ", "root password", ui, users) == Identity("root", "admin")
    # Every failure is the same None: a wrong password, an unknown name, the shared password under a name.
    for name, given in (("alice", "root password"), ("nobody", "alice password"), ("alice", "shared-password"),
                        ("alice", ""), ("alice", "a" * 200)):
        assert password_login(name, given, ui, users) is None
    # The shared passwords are their own identities: never `local`, who owns the CLI's sessions (issue 34).
    assert password_login("", "shared-password", ui, users) == Identity("shared:user", "user")
    assert password_login("", "shared-admin-pw", ui, users) == Identity("shared:admin", "admin")
    assert password_login("", "alice password", ui, users) is None


def test_named_accounts_make_a_loopback_ui_ask_who_you_are() -> None:
    assert not access_policy("127.0.0.1", UIConfig()).login_required
    policy = access_policy("127.0.0.1", UIConfig(), accounts=True)
    assert policy.login_required and policy.methods == ("password",)
    # Accounts are a login: an exposed UI with accounts and no shared password serves (the password form).
    assert access_policy("0.0.0.0", UIConfig(), accounts=True).methods == ("password",)


def test_oidc_identity_by_issuer_and_subject_and_refused_without_them() -> None:
    ui = UIConfig(oidc=True, admin_emails=["Boss@Example.org"])
    iss = "https://id.example.org"
    boss = oidc_identity({"iss": iss, "sub": "sub-1", "email": "Boss@example.ORG", "email_verified": True}, ui)
    assert boss == Identity(oidc_user_id(iss, "sub-1"), "admin") and boss.label == "boss@example.org"
    assert boss.user_id.startswith("oidc:") and boss.user_id.endswith(":sub-1")
    # Unverified or unsaid: the same subject, no admin, and the id (not the address) as the label.
    for claims in ({"email_verified": False}, {}):
        who = oidc_identity({"iss": iss, "sub": "sub-1", "email": "boss@example.org", **claims}, ui)
        assert who == Identity(boss.user_id, "user") and who.label == boss.user_id
    # Another issuer's "sub-1" is somebody else; a subject that could be read as an e-mail (lower-cased) is hashed.
    assert oidc_user_id("https://other.example", "sub-1") != boss.user_id
    odd = oidc_user_id(iss, "Ada@Example.org")
    assert odd != oidc_user_id(iss, "ada@example.org") and "@" not in odd and ":#" in odd
    assert oidc_identity({"iss": iss, "sub": "2f1c-77"}, ui) == Identity(oidc_user_id(iss, "2f1c-77"), "user")
    for claims in ({"iss": iss}, {"sub": "2f1c-77", "email": "a@b.c"}, {"iss": iss, "sub": "  "}, {}):
        with pytest.raises(LoginRefused, match="no issuer or no subject"):
            oidc_identity(claims, ui)
