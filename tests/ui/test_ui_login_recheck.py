"""Issue 46, item 7: a login is re-checked at every page load (and so before every run starts, which happens in a page
load), not only when it is made. Before, the browser session kept the user id and role it logged in with until it
logged out: a removed account, an admin made a user, an e-mail taken off the admin list, or the open UI's `local`
admin after named accounts were added all kept their access.

Real parts: the login page and the pages after it through Streamlit's AppTest on app/ui/main.py, a real SQLite store
changed through the same `Users` calls `rubricem users` makes. No model is loaded (nobody asks a question).
"""

from __future__ import annotations

from pydantic import SecretStr
from streamlit.testing.v1 import AppTest

from app.container import Services
from app.settings import UIConfig
from store.users import Users
from tests.ui.test_ui_login_security import (
    ISSUER,
    MAIN,
    SHARED,
    TIMEOUT,
    _log_in,
    _oidc_page,
    light,  # noqa: F401 - fixture
)


def _signed_out(at: AppTest) -> bool:
    return "user_id" not in at.session_state and [s.value for s in at.subheader] == ["Log in"] and not at.chat_input


def test_a_removed_or_demoted_account_loses_its_access_at_the_next_page_load(light: object) -> None:  # noqa: F811
    svc: Services = light(UIConfig(password=SecretStr(SHARED)))  # type: ignore[operator]
    users = Users(svc.log)
    users.add("alice", password="alice's password", role="admin")
    at = _log_in(AppTest.from_file(MAIN, default_timeout=TIMEOUT).run(), "alice", "alice's password")
    assert not at.exception, at.exception
    assert (at.session_state["user_id"], at.session_state["role"]) == ("alice", "admin") and at.chat_input

    # The operator makes her a user (`rubricem users remove alice`, then `users add alice` without --admin; she owned
    # nothing yet, so the name may be made again). Issue 65: the account made again is a new account, so the browser
    # signed in to the old one is signed out; she logs in again as the user she now is.
    users.remove("alice")
    users.add("alice", password="alice's password")
    at.run()
    assert not at.exception, at.exception
    assert _signed_out(at)
    at = _log_in(at, "alice", "alice's password")
    assert (at.session_state["user_id"], at.session_state["role"]) == ("alice", "user")

    # Then removes her: the next page load (any click) is a login form, and nothing of her chat is kept.
    users.remove("alice")
    at.run()
    assert not at.exception, at.exception
    assert _signed_out(at)


def test_an_email_taken_off_the_admin_list_stops_being_admin(light: object) -> None:  # noqa: F811
    light(UIConfig(oidc=True, admin_emails=["boss@example.org"]))  # type: ignore[operator]
    at = _oidc_page({"iss": ISSUER, "sub": "boss-subject", "email": "boss@example.org", "email_verified": True})
    assert not at.exception, at.exception
    assert at.session_state["role"] == "admin"
    boss = at.session_state["user_id"]

    light(UIConfig(oidc=True, admin_emails=[]))  # type: ignore[operator]  # the list changed; her browser stays
    at.run()
    assert not at.exception, at.exception
    assert (at.session_state["user_id"], at.session_state["role"]) == (boss, "user")


def test_the_open_ui_admin_must_log_in_once_named_accounts_exist(light: object) -> None:  # noqa: F811
    svc: Services = light(UIConfig())  # type: ignore[operator]  # loopback, no login: everyone is `local`, an admin
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run()
    assert (at.session_state["user_id"], at.session_state["role"]) == ("local", "admin")

    Users(svc.log).add("alice", password="alice's password")  # now the loopback UI asks who you are
    at.run()
    assert not at.exception, at.exception
    assert _signed_out(at)


def test_a_shared_login_ends_when_its_password_is_unset(light: object) -> None:  # noqa: F811
    both = UIConfig(password=SecretStr(SHARED), admin_password=SecretStr("shared-admin-password"))
    light(both)  # type: ignore[operator]
    at = _log_in(AppTest.from_file(MAIN, default_timeout=TIMEOUT).run(), "", "shared-admin-password")
    assert (at.session_state["user_id"], at.session_state["role"]) == ("shared:admin", "admin")

    light(UIConfig(password=SecretStr(SHARED)))  # type: ignore[operator]  # RUBRICEM_UI__ADMIN_PASSWORD unset
    at.run()
    assert not at.exception, at.exception
    assert _signed_out(at)
