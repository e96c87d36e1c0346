"""Issue 65, finding 2, through the real login page (Streamlit's AppTest on app/ui/main.py, a real SQLite store
changed through the same `Users` calls `rubricem users` makes): a browser signed in to an account stays signed in to
that account only. The account removed and made again under its name, or its password set anew, signs it out at the
next page load; before, the browser went on as the new account (and, with data kept under the name, saw the old
person's history). No model is loaded (nobody asks a question).
"""

from __future__ import annotations

from pydantic import SecretStr
from streamlit.testing.v1 import AppTest

from app.container import Services
from app.settings import UIConfig
from store.users import Users
from tests.ui.test_ui_login_security import (
    MAIN,
    SHARED,
    TIMEOUT,
    _log_in,
    light,  # noqa: F401 - fixture
)


def _signed_out(at: AppTest) -> bool:
    return "user_id" not in at.session_state and [s.value for s in at.subheader] == ["Log in"] and not at.chat_input


def test_a_browser_of_a_removed_account_is_not_signed_in_to_its_successor(light: object) -> None:  # noqa: F811
    svc: Services = light(UIConfig(password=SecretStr(SHARED)))  # type: ignore[operator]
    users = Users(svc.log)
    users.add("alice", password="alice's password")
    at = _log_in(AppTest.from_file(MAIN, default_timeout=TIMEOUT).run(), "alice", "alice's password")
    assert not at.exception, at.exception
    assert at.session_state["user_id"] == "alice" and at.chat_input

    users.remove("alice")  # she owned nothing yet, so the name may be made again: for someone else
    users.add("alice", password="the new alice's password")
    at.run()
    assert not at.exception, at.exception
    assert _signed_out(at)


def test_set_password_signs_out_every_browser_of_the_account(light: object) -> None:  # noqa: F811
    svc: Services = light(UIConfig(password=SecretStr(SHARED)))  # type: ignore[operator]
    users = Users(svc.log)
    users.add("bob", password="bob's password")
    browsers = [_log_in(AppTest.from_file(MAIN, default_timeout=TIMEOUT).run(), "bob", "bob's password")
                for _ in range(2)]
    assert all(b.session_state["user_id"] == "bob" for b in browsers)

    users.set_password("bob", "bob's new password")
    for at in browsers:
        at.run()
        assert not at.exception, at.exception
        assert _signed_out(at)
    again = _log_in(AppTest.from_file(MAIN, default_timeout=TIMEOUT).run(), "bob", "bob's new password")
    assert again.session_state["user_id"] == "bob" and again.chat_input
    again.run()  # the new login holds across page loads
    assert again.session_state["user_id"] == "bob" and again.chat_input
