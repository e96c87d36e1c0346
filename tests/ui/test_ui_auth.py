"""Who may use the UI: open on loopback (to loopback Host headers only), a login off loopback, refusal when exposed
without one or with a shared password too short; OIDC admins only by a verified e-mail; failed logins back off per
address and per name, before any password is checked."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from app.settings import UIConfig
from app.ui.auth import (
    LoginLimiter,
    UIAccessError,
    access_policy,
    attempt_password_login,
    host_header_is_loopback,
    is_loopback,
    oidc_role,
    open_ui_host_refusal,
    password_role,
)

USER_PW, ADMIN_PW = "user-password-1", "admin-password-1"  # at least 12 characters, as access_policy demands


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
    assert access_policy("0.0.0.0", UIConfig(password=SecretStr(USER_PW))).methods == ("password",)
    assert access_policy("10.0.0.5", UIConfig(oidc=True)).methods == ("oidc",)
    both = access_policy("10.0.0.5", UIConfig(admin_password=SecretStr(ADMIN_PW), oidc=True))
    assert both.login_required and both.methods == ("password", "oidc") and both.open_role is None


def test_a_password_on_loopback_still_requires_login() -> None:
    assert access_policy("127.0.0.1", UIConfig(password=SecretStr(USER_PW))).login_required


def test_password_roles() -> None:
    ui = UIConfig(password=SecretStr(USER_PW), admin_password=SecretStr(ADMIN_PW))
    assert password_role(ADMIN_PW, ui) == "admin"
    assert password_role(USER_PW, ui) == "user"
    assert password_role("wrong", ui) is None
    assert password_role("", ui) is None
    assert password_role(USER_PW, UIConfig(admin_password=SecretStr(ADMIN_PW))) is None


def test_oidc_admins_by_verified_email_only() -> None:
    ui = UIConfig(oidc=True, admin_emails=["Ada@Example.org"])
    assert oidc_role("ada@example.org", ui, email_verified=True) == "admin"
    assert oidc_role("ada@example.org", ui, email_verified="true") == "admin"  # a provider that sends a string
    assert oidc_role("bob@example.org", ui, email_verified=True) == "user"
    assert oidc_role(None, ui, email_verified=True) == "user"
    # Only a verified address makes an admin: not an unverified one, and not one from a provider without the claim
    # (issue 34: such providers may let anybody set any address).
    for unverified in (False, "false", None, "yes", 1, "1"):
        assert oidc_role("ada@example.org", ui, email_verified=unverified) == "user"
    assert oidc_role("ada@example.org", ui) == "user"


def test_an_empty_password_setting_means_none() -> None:
    ui = UIConfig(password="", admin_password="  ")  # type: ignore[arg-type]
    assert ui.password is None and ui.admin_password is None
    with pytest.raises(UIAccessError):
        access_policy("0.0.0.0", ui)


def test_short_shared_passwords_are_refused_at_start_naming_the_setting() -> None:
    """Issue 34: "pw" was a valid shared password; `rubricem ui` and the page both call access_policy."""
    for ui, setting in ((UIConfig(password=SecretStr("short-pw")), "RUBRICEM_UI__PASSWORD"),
                        (UIConfig(password=SecretStr(USER_PW), admin_password=SecretStr("adm")),
                         "RUBRICEM_UI__ADMIN_PASSWORD")):
        for host in ("127.0.0.1", "0.0.0.0"):
            with pytest.raises(UIAccessError, match=f"{setting} is [0-9]+ characters long; it needs at least 12"):
                access_policy(host, ui)
    assert access_policy("0.0.0.0", UIConfig(password=SecretStr("x" * 12))).login_required


@pytest.mark.parametrize(("header", "ok"), [
    ("localhost", True), ("localhost:8501", True), ("LOCALHOST:8501", True), ("127.0.0.1", True),
    ("127.0.0.1:8501", True), ("127.9.8.7:1", True), ("[::1]", True), ("[::1]:8501", True),
    ("rebind.test:8501", False), ("localhost.evil.example", False), ("127.0.0.1.evil.example:8501", False),
    ("evil.example:8501@127.0.0.1", False), ("localhost:85x1", False), ("[::1]x", False), ("::1", False),
    ("0.0.0.0:8501", False), ("192.168.1.20:8501", False), ("", False), (None, False),
])
def test_loopback_host_headers(header: str | None, ok: bool) -> None:
    assert host_header_is_loopback(header) is ok


def test_the_open_ui_refuses_a_foreign_host_header() -> None:
    """DNS rebinding: the browser sends the attacker's name as Host; no headers at all is no HTTP request (AppTest)."""
    assert open_ui_host_refusal({}) is None
    assert open_ui_host_refusal({"Host": "localhost:8501", "Origin": "http://localhost:8501"}) is None
    refusal = open_ui_host_refusal({"Host": "rebind.test:8501"})
    assert refusal is not None and "rebind.test:8501" in refusal and "http://localhost:<port>" in refusal
    assert open_ui_host_refusal({"User-Agent": "x"}) is not None  # a request without a Host is not loopback


def test_failed_logins_back_off_per_address_and_per_name_before_any_check() -> None:
    ui = UIConfig(password=SecretStr(USER_PW))
    limiter = LoginLimiter(free=3, max_backoff_s=60.0, checks_per_s=1000.0)
    for _ in range(3):
        assert attempt_password_login("", "guess", ui, None, limiter, "203.0.113.5", now=100.0).message == (
            "Wrong name or password.")
    # Locked: even the right password is refused, from the same address, without a check; the count is unchanged.
    locked = attempt_password_login("", USER_PW, ui, None, limiter, "203.0.113.5", now=100.5)
    assert locked.identity is None and locked.message.startswith("Too many failed logins") and "2 s" in locked.message
    # The name (here: the shared password) is locked from any address: a spread-out guesser gains nothing ...
    assert attempt_password_login("", USER_PW, ui, None, limiter, "198.51.100.7", now=100.5).identity is None
    # ... and the address is locked for any name.
    assert attempt_password_login("bob", "x", ui, None, limiter, "203.0.113.5", now=100.5).message.startswith("Too")
    # After the wait one try is let through; each further failure doubles the wait, up to max_backoff_s.
    assert attempt_password_login("", "guess", ui, None, limiter, "203.0.113.5", now=102.1).message.startswith("Wrong")
    assert "4 s" in attempt_password_login("", USER_PW, ui, None, limiter, "203.0.113.5", now=102.1).message
    ok = attempt_password_login("", USER_PW, ui, None, limiter, "203.0.113.5", now=106.2)
    assert ok.identity is not None and ok.identity.user_id == "shared:user"
    for t in range(20):
        limiter.failed(("addr:x",), now=200.0 + t)
    assert limiter.wait_s(("addr:x",), now=219.0) == 60.0
    # IPv6 addresses count by their /64: one host holds all of it.
    v6 = LoginLimiter(free=1, checks_per_s=1000.0)
    attempt_password_login("a", "x", ui, None, v6, "2001:db8:1:2::1", now=1.0)
    assert attempt_password_login("b", "x", ui, None, v6, "2001:db8:1:2:ffff::9", now=1.0).message.startswith("Too")
    assert attempt_password_login("c", "x", ui, None, v6, "2001:db8:1:3::1", now=1.0).message.startswith("Wrong")


def test_a_burst_from_many_addresses_is_capped_before_bcrypt() -> None:
    """Every unauthenticated attempt costs a bcrypt check; the process does at most checks_per_s of them."""
    ui = UIConfig(password=SecretStr(USER_PW))
    limiter = LoginLimiter(free=5, checks_per_s=2.0)
    answers = [attempt_password_login(f"user{i}", "guess", ui, None, limiter, f"198.51.100.{i}", now=50.0).message
               for i in range(10)]
    assert answers[:4] == ["Wrong name or password."] * 4  # the burst: twice the rate
    assert all(a.startswith("The server is checking many logins") for a in answers[4:])
    assert attempt_password_login("", USER_PW, ui, None, limiter, "192.0.2.1", now=50.6).identity is not None
