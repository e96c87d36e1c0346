"""MCP servers' tools in the agent (issue 21, item 5), against real MCP servers written with the SDK.

The servers (tests/tools/mcp_servers.py) run as real processes: over stdio (started by the client per call) and over
streamable HTTP on 127.0.0.1. The agent is the real graph and ResearchService with a real session log; only the
policy is scripted, so that the "model" calls the MCP tool and cites what it returned.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.config import AgentConfig, McpServerConfig, RunOptions, StageTokenCaps
from agent.errors import McpToolError, ToolConfigError
from agent.protocols import SearchTool
from agent.tools.mcp_client import McpTool, build_arguments, discover
from app.container import ConfigurationError, build_mcp_tools
from app.service import ResearchOutcome, ResearchService
from app.settings import Settings
from store.session_log import SessionLog
from tests.agent.scripts import well_formed
from tests.fakes import ScriptedPolicy
from tests.servers import free_port, server_process

SERVERS = Path(__file__).resolve().parent / "mcp_servers.py"
SECRET = "sk-mcp-test-7f3a91c2"  # the HTTP server's API key: it must reach the server and nowhere else
START_S = 60.0  # generous: two busy cores start a Python process with the SDK in one to several seconds
OPTS = RunOptions(max_tool_calls=1, token_caps=StageTokenCaps(plan=400, research=200, review=200, answer=200),
                  wall_clock_s=300, context_tokens=65536, inject_bank=False)


def stdio(tools: list[str] | None, *extra: str, timeout_s: float = START_S, **kw: object) -> McpServerConfig:
    """The test server over stdio (a fresh process per call)."""
    return McpServerConfig(name="docs", command=sys.executable, args=[str(SERVERS), "stdio", *extra], tools=tools,
                           timeout_s=timeout_s, **kw)  # type: ignore[arg-type]


def http(url: str, tools: list[str] | None, *, timeout_s: float = START_S, **kw: object) -> McpServerConfig:
    """The test server over streamable HTTP, with its API key in a header."""
    return McpServerConfig(name="web", url=url, headers={"X-Api-Key": SECRET}, tools=tools, timeout_s=timeout_s,
                           **kw)  # type: ignore[arg-type]


def http_process() -> tuple[list[str], str, str]:
    """The command that serves the test server over HTTP on a free port, its health URL and its MCP endpoint."""
    port = free_port()
    cmd = [sys.executable, str(SERVERS), "http", str(port), SECRET]
    return cmd, f"http://127.0.0.1:{port}/health", f"http://127.0.0.1:{port}/mcp"


@pytest.fixture(scope="module")
def http_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The test server over streamable HTTP on 127.0.0.1 for this module; stopped by pid at the end."""
    tmp = tmp_path_factory.mktemp("mcp-http")
    cmd, health, url = http_process()
    with server_process("MCP test server", cmd, health, tmp / "server.log", START_S):
        yield url


def tools_of(*configs: McpServerConfig) -> dict[str, McpTool]:
    return asyncio.run(discover(list(configs), {"local_search"}))


def research(tools: dict[str, SearchTool], tool: str, tmp_path: Path) -> tuple[ResearchOutcome, SessionLog]:
    """One real session whose scripted model calls `tool` once and cites the first snippet it gets back."""
    log = SessionLog(tmp_path / "s.sqlite3")
    policy = ScriptedPolicy(well_formed(n_calls=1, tool=tool, bogus_cite=False))
    service = ResearchService(policy, tools, log, AgentConfig())
    return asyncio.run(service.run("Who was Haymo of Faversham?", OPTS)), log


# ---- the agent calls an MCP tool and cites it --------------------------------------------------------------------


def test_a_stdio_mcp_tool_joins_the_prompt_is_called_and_cited(tmp_path: Path) -> None:
    tools = tools_of(stdio(["lookup"]))
    assert list(tools) == ["lookup"]  # the allow-list keeps the server's other tools out
    outcome, log = research(dict(tools), "lookup", tmp_path)

    system = outcome.trajectory.prompt.text
    assert "- lookup: Look up passages about a person in the friary archive. (MCP server docs)" in system
    assert "query (string, required); limit (integer)" in system  # its argument schema, in words
    call = outcome.trajectory.tool_calls[0]
    assert call.tool == "lookup" and call.error is None and len(call.snippets) == 2
    assert "Franciscan friar" in call.snippets[0].text
    ref = outcome.report.references[0]
    assert ref.id == call.snippets[0].id and ref.tool == "lookup" and not outcome.report.attributed
    assert "[1]" in outcome.report.body and "docs: lookup" in outcome.report.markdown
    stored = log.get(outcome.session_id)
    assert stored.status == "completed" and stored.trajectory.tool_calls[0].snippets == call.snippets


def test_an_http_mcp_tool_gets_its_header_and_the_secret_goes_nowhere_else(
    http_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    tools = tools_of(http(http_url, ["whoami", "lookup"]))
    assert sorted(tools) == ["lookup", "whoami"]
    outcome, _ = research(dict(tools), "whoami", tmp_path)

    call = outcome.trajectory.tool_calls[0]
    assert call.error is None and [s.text for s in call.snippets] == ["authorized"]  # the header reached the server
    assert outcome.report.references[0].text == "authorized"
    assert SECRET not in outcome.trajectory.prompt.text
    assert all(SECRET not in t.text for t in outcome.trajectory.turns)
    stored = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("s.sqlite3"))
    assert stored and SECRET.encode() not in stored
    assert SECRET not in caplog.text
    assert SECRET not in repr(tools["whoami"].server) and SECRET not in str(tools["whoami"].server.model_dump())


# ---- a server that is down, slow or failing: a recorded tool error, and the session finishes -----------------------


@pytest.mark.parametrize(("transport", "tool", "expected"), [
    ("stdio", "crash", "the MCP server 'docs' failed"),
    ("stdio", "slow", "did not answer within 15 s"),
    ("stdio", "fail", "reported an error: Error executing tool fail: the archive database is offline"),
    ("http", "slow", "did not answer within 15 s"),
    ("http", "fail", "the archive database is offline"),
])
def test_a_failing_mcp_server_gives_a_recorded_tool_error_and_the_session_finishes(
    transport: str, tool: str, expected: str, http_url: str, tmp_path: Path
) -> None:
    timeout = 15.0 if tool == "slow" else START_S
    cfg = stdio([tool], timeout_s=timeout) if transport == "stdio" else http(http_url, [tool], timeout_s=timeout)
    outcome, log = research(dict(tools_of(cfg)), tool, tmp_path)
    _assert_recorded_error(outcome, log, tool, expected)


def test_an_http_mcp_server_that_went_down_gives_a_recorded_tool_error(tmp_path: Path) -> None:
    cmd, health, url = http_process()
    with server_process("MCP test server", cmd, health, tmp_path / "server.log", START_S):
        tools = tools_of(http(url, ["lookup"]))
    outcome, log = research(dict(tools), "lookup", tmp_path)  # the server was stopped after listing its tools
    _assert_recorded_error(outcome, log, "lookup", "the MCP server 'web' failed (ConnectError")


def _assert_recorded_error(outcome: ResearchOutcome, log: SessionLog, tool: str, expected: str) -> None:
    call = outcome.trajectory.tool_calls[0]
    assert call.tool == tool and call.snippets == () and call.error is not None and expected in call.error
    assert SECRET not in call.error and "http://" not in call.error  # no key, no URL in what the model reads
    outputs = [t.text for t in outcome.trajectory.turns if t.kind == "tool_output"]
    assert len(outputs) == 1 and f"Error: {call.error}" in outputs[0]
    stored = log.get(outcome.session_id)
    assert stored.status == "completed" and stored.report == outcome.report.markdown
    assert stored.trajectory.tool_calls[0].error == call.error
    assert [t.stage for t in stored.trajectory.turns if t.kind == "sampled"][-1] == "answer"


def test_a_server_that_is_down_at_start_is_left_out_with_a_warning() -> None:
    said: list[str] = []
    nowhere = http(f"http://127.0.0.1:{free_port()}/mcp", None, timeout_s=10)
    tools = asyncio.run(discover([nowhere, stdio(["lookup"])], {"local_search"}, say=said.append))
    assert list(tools) == ["lookup"]  # the other server's tools are still offered
    assert len(said) == 1 and "the MCP server 'web' could not list its tools" in said[0]
    assert "not offered" in said[0] and SECRET not in said[0] and "127.0.0.1" not in said[0]


# ---- only read-only tools are offered (issue 34, finding 3) --------------------------------------------------------


def test_only_read_only_mcp_tools_are_offered_and_a_call_to_another_is_refused(tmp_path: Path) -> None:
    """`delete_record` has a side effect (it writes the journal) and is not annotated read-only: with no allow-list it
    is not offered, a call to it is refused as a tool error, and the journal is never written. The server's
    `allow_side_effects` offers it."""
    journal = tmp_path / "journal.txt"
    cfg = stdio(None, "--journal", str(journal))
    said: list[str] = []
    tools = asyncio.run(discover([cfg], {"local_search"}, say=said.append))
    assert "lookup" in tools and "delete_record" not in tools
    assert any("'delete_record' is not offered" in m and "allow_side_effects" in m for m in said)

    outcome, _ = research(dict(tools), "delete_record", tmp_path)
    call = outcome.trajectory.tool_calls[0]
    assert call.snippets == () and call.error is not None and "unknown tool 'delete_record' (not offered" in call.error
    assert "delete_record" not in outcome.trajectory.prompt.text  # never listed to the model
    # A tool built for it anyway refuses before the server is contacted.
    from agent.tools.mcp_client import list_server_tools

    spec = next(s for s in asyncio.run(list_server_tools(cfg)) if s.remote_name == "delete_record")
    assert not spec.read_only
    with pytest.raises(McpToolError, match="refused: the tool may change things.*allow_side_effects"):
        asyncio.run(McpTool(spec, cfg)("r1", {}, "0000000a"))
    assert not journal.exists()

    allowed = stdio(None, "--journal", str(journal), allow_side_effects=["delete_record"])
    granted = asyncio.run(discover([allowed], {"local_search"}))
    assert [s.text for s in asyncio.run(granted["delete_record"]("r2", {}, "0000000b"))] == ["deleted r2"]
    assert journal.read_text() == "r2\n"
    with pytest.raises(ValueError, match="allow_side_effects names 'delete_record', which its `tools` allow-list"):
        McpServerConfig(name="x", command="y", tools=["lookup"], allow_side_effects=["delete_record"])


# ---- huge, binary, malformed and hostile content -------------------------------------------------------------------


def test_huge_output_is_cut_to_the_snippet_budget_and_stays_inside_tool_output(tmp_path: Path) -> None:
    tools = tools_of(stdio(["huge", "sneaky"]))
    snippets = asyncio.run(tools["huge"]("anything", {}, "0000000a"))
    assert len(snippets) == 1 and len(snippets[0].text) <= 700 and snippets[0].text.startswith("Haymo archive")

    outcome, _ = research(dict(tools), "sneaky", tmp_path)
    output = next(t.text for t in outcome.trajectory.turns if t.kind == "tool_output")
    assert output.count("</tool_output>") == 1 and output.count("<tool_output>") == 1  # no early close, no new block
    assert "&lt;/tool_output&gt;" in output and "<answer>pwned" not in output
    assert "pwned" not in outcome.trajectory.prompt.text  # tool output never reaches the system prompt


@pytest.mark.parametrize(("tool", "expected"), [
    ("picture", "returned only content that is not text (image/png)"),
    ("noise", "returned only content that is not text (binary text)"),
])
def test_binary_output_is_a_tool_error(tool: str, expected: str) -> None:
    tools = tools_of(stdio([tool]))
    with pytest.raises(McpToolError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        asyncio.run(tools[tool]("anything", {}, "0000000a"))


def test_a_malformed_result_is_a_tool_error() -> None:
    garbage = McpServerConfig(name="garbage", command=sys.executable, args=[str(SERVERS), "garbage"],
                              timeout_s=START_S)
    tools = asyncio.run(discover([garbage], set()))
    with pytest.raises(McpToolError, match="the MCP server 'garbage' failed \\(a malformed response"):
        asyncio.run(tools["mangled"]("anything", {}, "0000000a"))


# ---- names: collisions with built-in tools are refused at start ----------------------------------------------------


def test_a_tool_named_like_a_built_in_is_refused_at_start_and_a_prefix_resolves_it() -> None:
    with pytest.raises(ToolConfigError, match="'local_search', which is a built-in tool's name.*prefix"):
        tools_of(stdio(None, "--builtin-name"))
    # An allow-listed name is checked before any server is contacted.
    never_started = McpServerConfig(name="x", command="/nonexistent/mcp-server", tools=["web_search"])
    settings = Settings(agent=AgentConfig(mcp_servers=[never_started]))
    with pytest.raises(ConfigurationError, match="'web_search', which is a built-in tool's name"):
        build_mcp_tools(settings, {})
    prefixed = tools_of(stdio(["local_search", "lookup"], "--builtin-name", prefix="docs_"))
    assert sorted(prefixed) == ["docs_local_search", "docs_lookup"]
    assert prefixed["docs_lookup"].spec.remote_name == "lookup"


def test_two_servers_offering_the_same_name_are_refused() -> None:
    a, b = stdio(["lookup"]), stdio(["lookup"]).model_copy(update={"name": "docs2"})
    with pytest.raises(ToolConfigError, match="'docs' and 'docs2' both offer a tool named 'lookup'"):
        asyncio.run(discover([a, b], set()))


# ---- arguments and settings ----------------------------------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"},
                                           "exact": {"anyOf": [{"type": "boolean"}, {"type": "null"}]}},
          "required": ["query"]}


def test_call_text_and_attributes_become_typed_arguments() -> None:
    assert build_arguments("t", " Haymo ", {"limit": "3", "exact": "true"}, SCHEMA) == {
        "query": "Haymo", "limit": 3, "exact": True}
    assert build_arguments("t", '{"query": "Haymo", "limit": 1}', {}, SCHEMA) == {"query": "Haymo", "limit": 1}
    with pytest.raises(McpToolError, match='argument limit="many" must be integer'):
        build_arguments("t", "Haymo", {"limit": "many"}, SCHEMA)
    with pytest.raises(McpToolError, match="do not parse"):
        build_arguments("t", '{"query": }', {}, SCHEMA)
    with pytest.raises(McpToolError, match="missing required argument\\(s\\) query"):
        build_arguments("t", '{"limit": 2}', {}, SCHEMA)


def test_mcp_servers_come_from_one_json_setting_and_bad_entries_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUBRICEM_AGENT__MCP_SERVERS", '[{"name": "web", "url": "http://127.0.0.1:9/mcp", '
                       f'"headers": {{"X-Api-Key": "{SECRET}"}}, "tools": ["lookup"], "timeout_s": 5}}]')
    cfg = Settings().agent.mcp_servers[0]
    assert cfg.headers["X-Api-Key"].get_secret_value() == SECRET and SECRET not in repr(Settings())
    with pytest.raises(ValueError, match="exactly one of `command`"):
        McpServerConfig(name="both", command="x", url="http://127.0.0.1/mcp")
    with pytest.raises(ValueError, match="not a usable tool name"):
        McpServerConfig(name="bad", command="x", tools=["has space"])
