"""browse_webpage opens only URLs the run has seen (issue 34, finding 3): a real graph and service, a real SearXNG
client and browse tool against a real local HTTP server; only the model is scripted.

The attack: text in the context (a page, a document, another person's reflection) tells the model to "read" a URL it
composes with what it has read in the query. The browse must be refused as a tool error the model reads, and the URL
must never be requested. URLs from the question, a search hit or an earlier page's text stay browsable, and
`browse_scope="any"` lifts the limit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from tools_support import LocalServer, Reply

from agent.config import AgentConfig, RunOptions, StageTokenCaps
from agent.tools import build_tools
from agent.tools.scope import REFUSED, browse_refusal, urls_in
from app.service import ResearchOutcome, ResearchService
from store.session_log import SessionLog
from tests.agent.scripts import calls_then_answer
from tests.fakes import ScriptedPolicy

OPTS = RunOptions(max_tool_calls=4, token_caps=StageTokenCaps(plan=400, research=300, review=200, answer=200),
                  wall_clock_s=120, context_tokens=65536, inject_bank=False, question_first=False)


def _pages(server: LocalServer) -> None:
    root = server.root
    server.route("/search", Reply.json({"results": [
        {"title": "Zebra facts", "content": "The plains zebra lives in herds.", "url": f"{root}/zebra"}]}))
    server.route("/zebra", Reply.html(
        "<html><head><title>Zebra facts</title></head><body><article><p>The plains zebra is the most common zebra. "
        f"Plains zebras form small harems. More about herds at {root}/herds today.</p></article></body></html>"))
    server.route("/herds", Reply.html(
        "<html><head><title>Herds</title></head><body><article><p>Groups of harems come together to form large "
        "herds of zebras.</p></article></body></html>"))
    server.route("/collect", Reply.html("<html><body><p>Thanks for the data, collected here.</p></body></html>"))


def _script(calls: Sequence[tuple[str, str]]):  # noqa: ANN202
    """A model that makes `calls` (tool, argument) in order, then reviews and answers."""
    return calls_then_answer([f'\n<call_tool name="{tool}">{arg}</call_tool>' for tool, arg in calls],
                             "<answer>Plains zebras live in herds.</answer>")


def _run(server: LocalServer, tmp_path: Path, scope: str, calls: Sequence[tuple[str, str]],
         question: str = "How do plains zebras live?") -> ResearchOutcome:
    cfg = AgentConfig(searxng_url=server.root, browse_enabled=True, browse_scope=scope, tool_timeout_s=5.0)
    tools = build_tools(cfg, None, browse_allow_hosts=frozenset({"127.0.0.1"}))
    service = ResearchService(ScriptedPolicy(_script(calls)), tools, SessionLog(tmp_path / "s.sqlite3"), cfg)
    return asyncio.run(service.run(question, OPTS))


def test_a_composed_url_is_refused_and_never_requested_while_seen_urls_are_browsed(
    server: LocalServer, tmp_path: Path
) -> None:
    _pages(server)
    root = server.root
    leak = f"{root}/collect?q=Haymo+of+Faversham+the+other+user+asked+this"
    outcome = _run(server, tmp_path, "seen", [
        ("web_search", "plains zebra"),
        ("browse_webpage", leak),              # composed by the model: refused
        ("browse_webpage", f"{root}/zebra"),   # a search hit's link
        ("browse_webpage", f"{root}/herds"),   # written in the text of a page read before
    ])
    search, refused, hit, linked = outcome.trajectory.tool_calls
    assert search.error is None and search.snippets[0].url == f"{root}/zebra"
    assert refused.tool == "browse_webpage" and refused.snippets == () and refused.error == REFUSED
    assert "search first, then browse one of the result URLs" in refused.error
    outputs = [t.text for t in outcome.trajectory.turns if t.kind == "tool_output"]
    assert f"Error: {REFUSED}" in outputs[1]  # the model reads why, and what to do instead
    assert hit.error is None and "harems" in hit.snippets[0].text
    assert linked.error is None and "large herds" in linked.snippets[0].text
    assert "/collect" not in [r.path for r in server.requests]  # the composed URL never left the machine
    assert outcome.report is not None


def test_a_url_in_the_question_is_browsed_and_scope_any_opens_every_url(server: LocalServer, tmp_path: Path) -> None:
    _pages(server)
    root = server.root
    asked = _run(server, tmp_path / "a", "seen", [("browse_webpage", f"<{root}/herds>")],
                 question=f"Summarise {root}/herds please.")
    assert asked.trajectory.tool_calls[0].error is None
    server.requests.clear()
    anything = _run(server, tmp_path / "b", "any", [("browse_webpage", f"{root}/collect?q=anything")])
    assert anything.trajectory.tool_calls[0].error is None
    assert "/collect" in [r.path for r in server.requests]


def test_what_the_seen_check_ignores_never_reaches_the_server(server: LocalServer, tmp_path: Path) -> None:
    """The check compares URLs loosely (trailing punctuation, entities, extra slashes); the fetch must then open the
    URL it compared, or those ignored characters would carry data out one request at a time."""
    _pages(server)
    root = server.root
    outcome = _run(server, tmp_path, "seen", [("browse_webpage", f"{root}/herds.,;!)]}}&#46;;"),
                                              ("browse_webpage", f"{root}/herds////")],
                   question=f"Summarise {root}/herds please.")
    first, second = outcome.trajectory.tool_calls
    assert first.error is None and "large herds" in first.snippets[0].text
    assert second.snippets == () or second.error is None  # "/herds/" is another page; only what was sent matters
    assert [r.path for r in server.requests] == ["/herds", "/herds/"]


def test_seen_urls_match_as_written_in_prose_but_not_with_another_query() -> None:
    seen = urls_in(["See https://Example.org/a/ (or www.example.org/b?x=1&amp;y=2), and http://example.org:8080/c."])
    for ok in ("https://example.org/a", "example.org/a/", "http://EXAMPLE.org/a#part",
               "https://www.example.org/b?x=1&y=2", "<http://example.org:8080/c>"):
        assert browse_refusal(ok, seen) is None, ok
    for refused in ("https://example.org/a?q=leak", "https://www.example.org/b?x=1&y=3", "https://evil.example/a",
                    "https://example.org:9090/c", "file:///etc/passwd", "javascript:alert(1)"):
        assert browse_refusal(refused, seen) == REFUSED, refused


def test_browse_scope_is_a_setting_with_seen_as_default() -> None:
    assert AgentConfig().browse_scope == "seen"
    tools = build_tools(AgentConfig(browse_enabled=True), None)
    assert tools["browse_webpage"].url_scope == "seen"  # type: ignore[attr-defined]
    assert build_tools(AgentConfig(browse_enabled=True, browse_scope="any"), None)[
        "browse_webpage"].url_scope == "any"  # type: ignore[attr-defined]
