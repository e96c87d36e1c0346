"""Resuming an interrupted session from the chat goes on as the person who resumed it (issue 65), and nobody else is
offered, or can reach, the resume of someone else's session.

The research runs on the UI's one event loop thread (app/ui/runner.py), where no one is signed in: a question the
person asks is started as them, and "Resume it" must go on as them too, or the rest of their run is served and
recorded as the open UI's admin, `local`.

Real parts: a real research process (the real service, SQLite session log, LangGraph checkpointer and graph, with the
scripted policy of tests/app/resume_worker.py) started as alice and SIGKILLed mid-research, as a crash leaves it;
then the login page and the research chat through Streamlit's AppTest (app/ui/main.py) on the real service. The
policy records who the run was going as at each model call.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import SecretStr
from streamlit.testing.v1 import AppTest

from agent.config import AgentConfig
from app.container import Services
from app.durable import DurableSessions
from app.service import ResearchService
from app.settings import Settings, UIConfig
from store.config import StoreConfig
from store.owner import current_actor
from store.registry import Registry
from store.session_log import SessionLog
from store.users import Users
from tests.app.resume_worker import LEASE, OPTIONS, QUESTION, script

ROOT = Path(__file__).resolve().parents[2]
MAIN = str(ROOT / "app" / "ui" / "main.py")
TIMEOUT = 120

# alice's question in a process of its own, killed while the model writes its first query (a checkpointed session
# whose process is gone: running, its lease lapsing, offered for resume).
_WORKER = """
import asyncio, sys
from pathlib import Path
from agent.config import AgentConfig
from app.durable import DurableSessions
from app.service import ResearchService
from store.config import StoreConfig
from store.owner import acting_as
from store.session_log import SessionLog
from tests.app.resume_worker import LEASE, OPTIONS, QUESTION, script

data = Path(sys.argv[1])
store = StoreConfig(data_dir=data)
log = SessionLog.from_config(store)
policy, search = script("research", data / "blocked")
service = ResearchService(policy, {"local_search": search}, log, AgentConfig(),
                          durable=DurableSessions.for_store(log, store), lease=LEASE)
with acting_as("alice"):
    asyncio.run(service.start(QUESTION, OPTIONS, source="chat"))
"""


def _interrupted_session_of_alice(data: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUBRICEM_")} | {"PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _WORKER, str(data)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    marker, deadline = data / "blocked", time.monotonic() + TIMEOUT
    try:
        while not marker.exists():
            assert proc.poll() is None, f"the worker exited early: {proc.communicate()}"
            assert time.monotonic() < deadline, "the worker never reached the blocking point"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
    time.sleep(LEASE.lease_s + 0.5)  # the killed process's lease runs out
    with SessionLog(StoreConfig(data_dir=data).sqlite_path) as log:
        (row,) = log.list_sessions()
        assert row.owner == "alice" and row.shown_status == "interrupted"
        return row.session_id


def _log_in(name: str, password: str) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run()
    at.text_input[0].input(name)
    at.text_input[1].input(password)
    at.button[0].click().run()
    assert at.session_state["user_id"] == name and at.session_state["role"] == "user"
    return at


def test_a_resume_goes_on_as_the_person_and_nobody_else_is_offered_it(
        tmp_path: Path, put_services: Callable[[Services, str | None], Services]) -> None:
    data = tmp_path / "data"
    data.mkdir()
    ui = UIConfig(password=SecretStr("shared-user-password"))
    settings = Settings(agent=AgentConfig(defaults=OPTIONS), store=StoreConfig(data_dir=data), ui=ui)
    log = SessionLog(settings.store.sqlite_path)
    Users(log).add("alice", password="alice's password")
    Users(log).add("bob", password="bob's password")
    sid = _interrupted_session_of_alice(data)

    policy, search = script(None, tmp_path / "blocked")
    inner, actors = policy.script, []

    def say(context: str, stop: Sequence[str]) -> str:
        actors.append(current_actor().owner)  # who the run goes as, at each model call
        return inner(context, stop)

    policy.script = say
    tools = {"local_search": search}
    research = ResearchService(policy, tools, log, settings.agent,  # type: ignore[arg-type]
                               durable=DurableSessions.for_store(log, settings.store))
    put_services(Services(settings, log, None, tools, policy, research, None, Registry(log)),  # type: ignore[arg-type]
                 ui.host)

    # bob: not in his history, and its id in the URL reads as a made-up one; nothing offers him its resume.
    at = _log_in("bob", "bob's password")
    assert not any(b.key == f"hist_{sid}" for b in at.sidebar.button)
    at.query_params["session"] = sid
    at.run()
    assert not at.exception, at.exception
    assert any(e.value == "Session not found." for e in at.error), [e.value for e in at.error]
    assert not any(b.key == f"resume_{sid}" for b in at.button)
    assert not any("interrupted" in str(w.value) for w in at.warning)
    assert log.get(sid).status == "running" and log.interrupted(sid) and actors == []  # untouched

    # alice: offered it in her history, and "Resume it" goes on as her.
    at = _log_in("alice", "alice's password")
    at.sidebar.button(key=f"hist_{sid}").click().run()
    assert any("This session was interrupted" in str(w.value) for w in at.warning)
    at.button(key=f"resume_{sid}").click().run()
    assert not at.exception, at.exception

    rec = log.get(sid)
    assert rec.status == "completed" and rec.owner == "alice"
    assert actors and set(actors) == {"alice"}, actors  # the resumed run's model calls: hers, never `local`
