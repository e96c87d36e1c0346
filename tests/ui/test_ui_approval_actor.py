"""Answering a paused plan in the chat goes on as the person who answered (issue 65), not as `local`.

The research runs on the UI's one event loop thread (app/ui/runner.py), where no one is signed in: a question the
person asks is started as them (chat_page), and a plan they accept must go on as them too, or the rest of their run
is served and recorded as the open UI's admin. Real parts: the login page and the research chat through Streamlit's
AppTest (app/ui/main.py), the real service, SQLite session log and LangGraph checkpointer; the policy is the scripted
one (tests/fakes.py), which records who the run was going as at each model call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import SecretStr
from streamlit.testing.v1 import AppTest

from agent.config import AgentConfig
from app.container import Services
from app.durable import DurableSessions
from app.service import ResearchPaused, ResearchService
from app.settings import Settings, UIConfig
from store.config import StoreConfig
from store.owner import acting_as, current_actor
from store.registry import Registry
from store.session_log import SessionLog
from store.session_log.checkpoints import SessionRuns
from store.users import Users
from tests.app.resume_worker import OPTIONS, QUESTION, script

MAIN = str(Path(__file__).resolve().parents[2] / "app" / "ui" / "main.py")


def test_an_accepted_plan_goes_on_as_the_person_who_accepted_it(
        tmp_path: Path, put_services: Callable[[Services, str | None], Services]) -> None:
    ui = UIConfig(password=SecretStr("shared-user-password"))
    settings = Settings(agent=AgentConfig(defaults=OPTIONS), store=StoreConfig(data_dir=tmp_path), ui=ui)
    log = SessionLog(settings.store.sqlite_path)
    Users(log).add("alice", password="alice's password")
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
    with acting_as("alice"):  # her question, paused after its plan
        paused = asyncio.run(research.start(QUESTION, OPTIONS, approve_plan=True))
    assert isinstance(paused, ResearchPaused) and actors == ["alice"]
    sid = paused.session_id

    at = AppTest.from_file(MAIN, default_timeout=120).run()
    at.text_input[0].input("alice")
    at.text_input[1].input("alice's password")
    at.button[0].click().run()
    assert at.session_state["user_id"] == "alice" and at.session_state["role"] == "user"
    at.sidebar.button(key=f"hist_{sid}").click().run()
    (accept,) = [b for b in at.button if b.label == "Accept"]
    accept.click().run()
    assert not at.exception, at.exception

    assert log.get(sid).status == "completed"
    approval = SessionRuns(log).approval(sid)
    assert approval is not None and (approval.action, approval.owner) == ("accept", "alice")
    assert len(actors) > 1 and set(actors[1:]) == {"alice"}, actors  # the resumed run's model calls: hers
