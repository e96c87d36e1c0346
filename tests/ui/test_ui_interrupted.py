"""The chat shows a session whose process stopped (its lease expired, issue 34) as interrupted, in the history and
on the page, and offers to resume it there.

Real parts: the research chat through Streamlit's AppTest on the real services of tests/ui/test_ui_apptest.py. The
interrupted session is written through the session log as a killed process leaves it (running, checkpointed, its
lease lapsed); the lease and resume themselves are tested with real processes in tests/app/test_resume.py.
"""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from app.container import Services
from store.records import PromptRecord
from store.session_log.checkpoints import SessionRuns
from tests.ui.test_ui_apptest import MAIN, TIMEOUT, make_services  # noqa: F401 - the fixture


def test_an_interrupted_session_is_shown_as_such_and_offered_for_resume(make_services: object) -> None:
    svc: Services = make_services()  # type: ignore[operator]
    prompt = PromptRecord(text="<|im_start|>user\nWho was Haymo?<|im_end|>\n", token_ids=(1, 2), prompt_sha="")
    sid = svc.log.create_session("Who was Haymo?", prompt, {}, "base", source="chat")
    SessionRuns(svc.log).start(sid, sid)
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run()
    (entry,) = [b for b in at.sidebar.button if b.key == f"hist_{sid}"]
    assert entry.label.startswith("🔄")
    entry.click().run(timeout=TIMEOUT)  # its process still holds it: running, and not offered for resume
    assert not any("interrupted" in w.value for w in at.warning)
    assert not any(b.key == f"resume_{sid}" for b in at.button)
    with svc.log.transaction(write=True) as conn:  # the process was killed: its lease runs out
        conn.execute("UPDATE sessions SET lease_until = heartbeat_at WHERE session_id = ?", (sid,))

    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run()
    (entry,) = [b for b in at.sidebar.button if b.key == f"hist_{sid}"]
    assert entry.label.startswith("⏸️") and "interrupted" in (entry.help or "")
    entry.click().run(timeout=TIMEOUT)
    assert not at.exception, at.exception
    assert any("This session was interrupted" in w.value for w in at.warning)
    assert any(b.key == f"resume_{sid}" for b in at.button)
