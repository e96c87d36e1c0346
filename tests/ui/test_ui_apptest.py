"""The research chat and learning pages through Streamlit's AppTest, on real services: the embedded SmolLM2 policy,
a real Chroma index and bank, a real SQLite session log. The smallest token caps that finish a run keep each question
to a few seconds."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import SecretStr
from streamlit.testing.v1 import AppTest

from agent.config import AgentConfig, RunOptions, StageTokenCaps
from agent.followup import FOLLOW_UP_MARK
from app.container import Services, open_bank
from app.service import ResearchService
from app.settings import Settings, UIConfig
from app.ui.view import md_literal
from store.config import StoreConfig
from store.embeddings import embed_texts
from store.registry import Registry
from store.session_log import SessionLog
from store.threads import ChatThreads

MAIN = str(Path(__file__).resolve().parents[2] / "app" / "ui" / "main.py")
TIMEOUT = 300


def _services(tmp_path: Path, policy: object, tools: dict[str, object], index: object, ui: UIConfig) -> Services:
    caps = StageTokenCaps(plan=16, research=24, review=16, answer=24)
    settings = Settings(
        agent=AgentConfig(defaults=RunOptions(token_caps=caps, max_tool_calls=1, seed=7)),
        store=StoreConfig(data_dir=tmp_path / "data"),
        ui=ui,
    )
    settings.store.data_dir.mkdir(parents=True, exist_ok=True)
    log = SessionLog(settings.store.sqlite_path)
    bank = open_bank(settings)
    research = ResearchService(policy, tools, log, settings.agent, bank, embed=embed_texts)  # type: ignore[arg-type]
    return Services(settings, log, index, tools, policy, research, bank, Registry(log))  # type: ignore[arg-type]


@pytest.fixture
def make_services(tmp_path: Path, embedded_policy: object, local_tools: dict[str, object],
                  small_index: object, put_services: Callable[[Services, str | None], Services]) -> object:
    def make(ui: UIConfig | None = None, bound: str | None = "settings") -> Services:
        """Services for the page; the server address is the UI host, as `rubricem ui --host` passes it (None: a
        plain `streamlit run` with no address)."""
        ui = ui or UIConfig()
        svc = _services(tmp_path, embedded_policy, local_tools, small_index, ui)
        return put_services(svc, ui.host if bound == "settings" else bound)

    return make


def _ask(at: AppTest, question: str) -> AppTest:
    at.chat_input[0].set_value(question).run(timeout=TIMEOUT)
    assert not at.exception, at.exception
    return at


@pytest.mark.slow
def test_ask_follow_up_feedback_and_history(make_services: object) -> None:
    svc: Services = make_services()  # type: ignore[operator]
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run()
    assert not at.exception
    assert any("rubricem research" in t.value for t in at.title)

    _ask(at, "Who was Haymo of Faversham?")
    (first,) = svc.log.list_sessions()
    assert first.status == "completed" and first.source == "chat"
    labels = [s.label for s in at.status]
    assert [label.split(" — ")[0] for label in labels] == ["Plan", "Research", "Review", "Answer"], labels
    assert all(s.state == "complete" for s in at.status)
    assert any(f"session `{first.session_id}`" in c.value for c in at.caption)
    assert any("**Answer**" in m.value for m in at.markdown)
    assert {b.label for b in at.download_button} == {"⬇ Markdown", "⬇ HTML", "⬇ PDF"}

    # feedback: a thumb and a note, stored with the session
    at.feedback(key=f"thumb_{first.session_id}").set_value(0)
    at.text_area(key=f"note_{first.session_id}").input("It never says when he lived.")
    at.button(key=f"send_{first.session_id}").click().run(timeout=TIMEOUT)
    (fb,) = svc.log.feedback(first.session_id)
    assert (fb.rating, fb.note) == ("down", "It never says when he lived.")
    assert any("feedback is stored" in s.value for s in at.success)

    # a follow-up is its own session, researched with the earlier exchange as context, in the same thread
    _ask(at, "Which order did he belong to?")
    sessions = svc.log.list_sessions()
    assert len(sessions) == 2
    follow = next(s for s in sessions if s.session_id != first.session_id)
    record = svc.log.get(follow.session_id)
    assert record.question.startswith("Which order did he belong to?" + FOLLOW_UP_MARK)
    assert "Q: Who was Haymo of Faversham?" in record.question
    threads = ChatThreads(svc.log)
    thread = threads.thread_of(first.session_id)
    assert thread is not None and threads.sessions(thread) == [first.session_id, follow.session_id]
    assert [m.markdown[0].value for m in at.chat_message if m.name == "user"] == [  # shown literally (issue 34)
        md_literal("Who was Haymo of Faversham?"), md_literal("Which order did he belong to?")]

    # history: a fresh visitor reopens the whole thread from the sidebar
    again = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run()
    again.sidebar.button(key=f"hist_{thread}").click().run(timeout=TIMEOUT)
    assert not again.exception
    assert len([m for m in again.chat_message if m.name == "user"]) == 2
    assert again.chat_input[0].placeholder == "Ask a follow-up"


def test_budgets_and_backends_come_from_the_sidebar(make_services: object) -> None:
    make_services()  # type: ignore[operator]
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run()
    assert at.sidebar.multiselect(key="backends").value == ["local_search"]
    assert at.sidebar.slider(key="max_calls").value == 1
    assert at.sidebar.selectbox(key="fmt").value == "long_form"
    assert any("No sessions yet." in c.value for c in at.sidebar.caption)


def test_exposed_ui_requires_the_password_and_roles_gate_retraining(make_services: object) -> None:
    make_services(UIConfig(host="0.0.0.0", password=SecretStr("user-password"),  # type: ignore[operator]
                           admin_password=SecretStr("admin-password")))
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run()
    assert [s.value for s in at.subheader] == ["Log in"] and not at.chat_input
    assert [t.label for t in at.text_input] == ["Name", "Password"]
    at.text_input[1].input("guess")
    at.button[0].click().run()
    assert any("Wrong name or password" in e.value for e in at.error) and not at.chat_input
    at.text_input[1].input("user-password")  # no name: the shared password, a one-person shortcut (shared:user)
    at.button[0].click().run()
    assert at.session_state["role"] == "user" and at.session_state["user_id"] == "shared:user" and at.chat_input
    assert "user-password" not in repr(at.session_state)  # only the user id and role are kept

    learning = AppTest.from_function(_learning_script, default_timeout=TIMEOUT)
    learning.session_state["role"] = "user"
    learning.run()
    assert not learning.exception
    assert not [b for b in learning.button if b.key == "retrain_now"]
    learning.session_state["role"] = "admin"
    learning.run()
    assert [b.label for b in learning.button if b.key == "retrain_now"] == ["🔁 Retrain now"]
    assert next(m.label for m in learning.metric) == "Live policy"
    assert learning.metric[0].value == "base"


def test_exposed_ui_without_a_login_refuses_to_serve(make_services: object) -> None:
    make_services(UIConfig(host="0.0.0.0"))  # type: ignore[operator]
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run()
    assert any("refusing to serve the UI on 0.0.0.0" in e.value for e in at.error)
    assert not at.chat_input and not at.text_input
    # `streamlit run` with no --server.address binds every interface: the gate fails closed, whatever the settings say
    make_services(UIConfig(host="127.0.0.1"), bound=None)  # type: ignore[operator]
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run()
    assert any("refusing to serve the UI on 0.0.0.0" in e.value for e in at.error) and not at.chat_input


def _learning_script() -> None:
    from app.ui import learning_page

    learning_page.page()


def test_admin_upload_indexes_good_files_and_refuses_a_bad_one_whole(make_services: object) -> None:
    from agent.errors import IngestError
    from app.container import open_index
    from app.uploads import ingest_uploads

    svc: Services = make_services()  # type: ignore[operator]
    index = open_index(svc.settings)  # a fresh, empty index (the shared test index stays as it is)
    uploads = svc.settings.store.data_dir / "uploads"
    good = ("notes.md", b"# Gannets\n\nNorthern gannets dive into the sea from thirty metres to catch fish.\n")
    with pytest.raises(IngestError):
        ingest_uploads([good, ("../../evil.txt", b"\x00\x01\x02 binary")], uploads, index)
    assert index.count() == 0 and not uploads.exists()
    with pytest.raises(IngestError, match="notes.md"):  # two names that clean up to one are refused together
        ingest_uploads([good, ("../notes.md", b"# Other\n\nSomething else entirely.\n")], uploads, index)
    assert index.count() == 0 and not uploads.exists()
    result = ingest_uploads([good], uploads, index)
    assert (result.chunks, result.files) == (1, ("notes.md",)) and index.count() == 1
    assert index.search("how do gannets catch fish", k=1)[0].title == "Gannets"
    ingest_uploads([good], uploads, index)  # the same name again replaces its chunks
    assert index.count() == 1
    assert [p.name for p in uploads.iterdir()] == ["notes.md"]
