"""Who may use the UI: open on loopback, a login off loopback, refusal when exposed without one."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from app.settings import UIConfig
from app.ui.auth import UIAccessError, access_policy, is_loopback, oidc_role, password_role


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.8.9.1", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("192.168.1.20", False), ("::", False), ("example.org", False), ("", False),
])
def test_loopback_detection(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_loopback_without_password_is_open_and_local_user_is_admin() -> None:
    policy = access_policy("127.0.0.1", UIConfig())
    assert not policy.login_required and policy.open_role == "admin" and policy.methods == ()


def test_exposed_without_any_login_is_refused() -> None:
    with pytest.raises(UIAccessError, match="RUBRICEM_UI__PASSWORD"):
        access_policy("0.0.0.0", UIConfig())


def test_exposed_with_password_or_oidc_requires_login() -> None:
    assert access_policy("0.0.0.0", UIConfig(password=SecretStr("pw"))).methods == ("password",)
    assert access_policy("10.0.0.5", UIConfig(oidc=True)).methods == ("oidc",)
    both = access_policy("10.0.0.5", UIConfig(admin_password=SecretStr("a"), oidc=True))
    assert both.login_required and both.methods == ("password", "oidc") and both.open_role is None


def test_a_password_on_loopback_still_requires_login() -> None:
    assert access_policy("127.0.0.1", UIConfig(password=SecretStr("pw"))).login_required


def test_password_roles() -> None:
    ui = UIConfig(password=SecretStr("user-pw"), admin_password=SecretStr("admin-pw"))
    assert password_role("admin-pw", ui) == "admin"
    assert password_role("user-pw", ui) == "user"
    assert password_role("wrong", ui) is None
    assert password_role("", ui) is None
    assert password_role("user-pw", UIConfig(admin_password=SecretStr("admin-pw"))) is None


def test_oidc_admins_by_email() -> None:
    ui = UIConfig(oidc=True, admin_emails=["Ada@Example.org"])
    assert oidc_role("ada@example.org", ui) == "admin"
    assert oidc_role("bob@example.org", ui) == "user"
    assert oidc_role(None, ui) == "user"
    # An address the identity provider marks unverified never makes an admin; a provider without the claim does.
    assert oidc_role("ada@example.org", ui, email_verified=False) == "user"
    assert oidc_role("ada@example.org", ui, email_verified="false") == "user"
    assert oidc_role("ada@example.org", ui, email_verified=True) == "admin"


def test_an_empty_password_setting_means_none() -> None:
    ui = UIConfig(password="", admin_password="  ")  # type: ignore[arg-type]
    assert ui.password is None and ui.admin_password is None
    with pytest.raises(UIAccessError):
        access_policy("0.0.0.0", ui)
