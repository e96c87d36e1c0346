"""Issue 46, item 10: resuming a session from the chat goes through the same per-run caps as asking.

Real parts: the login page and the research chat through Streamlit's AppTest (app/ui/main.py), a real SQLite store
with durable sessions, a real Chroma bank. The policy is never built: a refused resume must not reach it, and the
old code's resume failed on the missing checkpoint before it would have generated anything.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pydantic import SecretStr
from streamlit.testing.v1 import AppTest

from agent.config import RunOptions
from app.container import Services, open_bank, open_index
from app.durable import DurableSessions
from app.service import ResearchService
from app.settings import Settings, UIConfig
from store import PromptRecord, SessionLog, StoreConfig
from store.registry import Registry
from store.users import Users

ROOT = Path(__file__).resolve().parents[2]
MAIN = str(ROOT / "app" / "ui" / "main.py")
TIMEOUT = 120
QUESTION = "What did the MCP client ask at length?"


def _services(tmp_path: Path, put_services: Callable[[Services, str | None], Services]) -> Services:
    ui = UIConfig(password=SecretStr("shared-user-password"))
    settings = Settings(store=StoreConfig(data_dir=tmp_path / "data"), ui=ui)
    settings.store.data_dir.mkdir(parents=True, exist_ok=True)
    log = SessionLog(settings.store.sqlite_path)
    bank = open_bank(settings, log=log)
    durable = DurableSessions.for_store(log, settings.store)
    research = ResearchService(None, {}, log, settings.agent, bank, durable=durable)  # type: ignore[arg-type]
    svc = Services(settings, log, open_index(settings), {}, None,  # type: ignore[arg-type]
                   research, bank, Registry(log))
    return put_services(svc, ui.host)


def test_a_resume_is_held_to_the_callers_run_caps(
        tmp_path: Path, put_services: Callable[[Services, str | None], Services]) -> None:
    """Alice (not an admin) may give a chat run at most 900 s and 10 tool calls. Her MCP session
    (RUBRICEM_MCP__OWNER=alice; MCP runs may have 3600 s and 50) was cut off when the server stopped. "Resume it" in
    the chat went on with the session's own options, past her caps: it must be refused, and change nothing."""
    svc = _services(tmp_path, put_services)
    Users(svc.log).add("alice", password="alice's password")
    options = RunOptions(wall_clock_s=3600, max_tool_calls=50).model_dump(mode="json")
    sid = svc.log.create_session(QUESTION, PromptRecord("p", (1,), "s"), options, "base", owner="alice",
                                 source="api")
    svc.research.durable.runs.start(sid, sid)  # type: ignore[union-attr]
    with svc.log.transaction(write=True) as conn:  # the MCP server was stopped: the lease runs out
        conn.execute("UPDATE sessions SET lease_until = heartbeat_at WHERE session_id = ?", (sid,))

    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run()
    at.text_input[0].input("alice")
    at.text_input[1].input("alice's password")
    at.button[0].click().run()
    assert at.session_state["user_id"] == "alice" and at.session_state["role"] == "user"
    at.sidebar.button(key=f"hist_{sid}").click().run()
    at.button(key=f"resume_{sid}").click().run()
    assert not at.exception, at.exception
    assert any("3600 s is over your limit of 900 s" in e.value for e in at.error), [e.value for e in at.error]
    # Refused before anything started: still the interrupted session it was, offered for resume again.
    assert svc.log.get(sid).status == "running" and svc.log.interrupted(sid)
    run = svc.research.durable.runs.get(sid)  # type: ignore[union-attr]
    assert run is not None and run.state == "active"
