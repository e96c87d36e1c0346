"""The research chat's privacy panel and the learning page's consent counts (issue 18), through Streamlit's AppTest
on the real page scripts and a real store: the open loopback UI is the local admin; turning consent off keeps its
sessions out of learning (the counts say so); "Delete my data" removes its sessions."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from app.container import Services
from store import PromptRecord
from store.users import Users
from tests.ui.test_ui_apptest import MAIN, TIMEOUT, _learning_script, make_services  # noqa: F401 - fixture


def test_consent_toggle_counts_and_delete_my_data(make_services: object) -> None:
    svc: Services = make_services()  # type: ignore[operator]
    for owner in ("local", "someone@example.org"):
        sid = svc.log.create_session(f"{owner}'s question?", PromptRecord("p", (1,), "s"), {}, "base", owner=owner,
                                     source="chat")
        svc.log.finish(sid, "completed", report="r")
    Users(svc.log).ensure("someone@example.org", kind="oidc", role="user")
    Users(svc.log).set_consent("someone@example.org", False)

    learning = AppTest.from_function(_learning_script, default_timeout=TIMEOUT)
    learning.session_state["role"] = "admin"
    learning.run()
    assert not learning.exception
    assert any("uses 1 completed session(s) and skips 1" in c.value for c in learning.caption)

    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run()
    assert not at.exception and at.session_state["user_id"] == "local"
    assert at.sidebar.toggle(key="consent_me").value is True  # the deployment default
    at.sidebar.toggle(key="consent_me").set_value(False).run()
    assert Users(svc.log).get("local").consent is False
    learning.run()
    assert any("uses 0 completed session(s) and skips 2" in c.value for c in learning.caption)

    at.sidebar.checkbox(key="sure").check().run()
    at.sidebar.button(key="delete_mine").click().run()
    assert not at.exception
    assert any("Deleted 1 session(s)" in s.value for s in at.success)
    assert [s.owner for s in svc.log.list_sessions()] == ["someone@example.org"]
    assert Users(svc.log).get("local").consent is False  # the UI keeps the account (and its choice)
