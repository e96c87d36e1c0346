"""The clarifying question in the research chat (issue 21), through Streamlit's AppTest with the scripted policy and
real session log and checkpointer: asking pauses the session with the question and a text box in its stage view;
sending an answer resumes the run there (on to the plan, which waits for approval: the chat's default), and the
answer is in the session's prompt."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from streamlit import config as st_config
from streamlit.testing.v1 import AppTest

from agent.clarify import DECISION_STOPS, clarification_block
from agent.config import AgentConfig
from app.container import Services
from app.durable import DurableSessions
from app.service import ResearchService
from app.settings import Settings, UIConfig
from app.ui import state
from app.ui.view import md_literal
from store.config import StoreConfig
from store.registry import Registry
from store.session_log import SessionLog
from store.session_log.checkpoints import SessionRuns
from tests.app.resume_worker import OPTIONS, QUESTION, script

MAIN = str(Path(__file__).resolve().parents[2] / "app" / "ui" / "main.py")
ASKED = "Which Haymo do you mean?"
ANSWER = "The Franciscan friar."


def test_the_chat_shows_the_question_and_goes_on_with_the_answer(tmp_path: Path) -> None:
    settings = Settings(agent=AgentConfig(defaults=OPTIONS), store=StoreConfig(data_dir=tmp_path), ui=UIConfig())
    log = SessionLog(settings.store.sqlite_path)
    policy, search = script(None, tmp_path / "blocked")
    inner = policy.script

    def say(context: str, stop: Sequence[str]) -> str:
        return f"ASK: {ASKED}" if tuple(stop) == DECISION_STOPS else inner(context, stop)

    policy.script = say
    tools = {"local_search": search}
    research = ResearchService(policy, tools, log, settings.agent,  # type: ignore[arg-type]
                               durable=DurableSessions.for_store(log, settings.store, clarify=True))
    state.use(Services(settings, log, None, tools, policy, research, None, Registry(log)))  # type: ignore[arg-type]
    st_config.set_option("server.address", "127.0.0.1")
    try:
        at = AppTest.from_file(MAIN, default_timeout=120).run()
        at.chat_input[0].set_value(QUESTION).run()
        assert not at.exception, at.exception
        (sid,) = [s.session_id for s in log.list_sessions()]
        run = SessionRuns(log).get(sid)
        assert run is not None and run.pause_kind == "clarification"
        assert any(md_literal(ASKED) in m.value for m in at.markdown)  # shown literally (issue 34)
        at.text_area(key=f"clarify_answer_{sid}").set_value(ANSWER)
        (send,) = [b for b in at.button if b.label == "Send and go on"]
        send.click().run()
        assert not at.exception, at.exception
        # The chat's plan approval is on by default: after the answer, the run goes on to its plan and waits there.
        run = SessionRuns(log).get(sid)
        assert run is not None and run.pause_kind == "plan", run
        rec = log.get(sid)
        assert clarification_block(ASKED, ANSWER) in rec.trajectory.prompt.text
        assert [t.stage for t in rec.trajectory.turns] == ["plan"]
        assert any(b.label == "Accept" for b in at.button)  # the plan's form is drawn next
    finally:
        state.use(None)
        st_config.set_option("server.address", None)
