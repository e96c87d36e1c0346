"""`rubricem mcp` (issue 21, item 6): the agent as an MCP server, driven by the `mcp` SDK's client.

The server is the real command in a subprocess. Over stdio it researches a question on the embedded default (the
one slow test); over streamable HTTP it is checked with a policy backend that is never called (nothing here samples),
so the bearer token, `get_session` and `search_bank` are tested without loading the model. The count of invented
citation ids in `research`'s result, and in `get_session`'s for the same session, is checked on the server built in
this process (`build_server`, the SDK's in-process client) over the real service with a scripted model that invents
one.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from agent.config import SHIPPED_SFT_ADAPTER
from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "mcp-token-5b1e0c7d-9a3f2e61c40b8d7f"  # at least 32 characters (issue 34)
START_S = 180.0  # the server indexes the bundled corpus before it listens


def base_env(tmp_path: Path) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("RUBRICEM_")} | {
        "HF_HUB_OFFLINE": "1",
        "RUBRICEM_STORE__DATA_DIR": str(tmp_path / "data"),
    }


def rubricem(args: list[str], env: dict[str, str], timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # model load, corpus indexing and one session: 5-8 minutes on two busy cores
def test_research_over_stdio_returns_a_report_with_references_on_the_embedded_default(
    tmp_path: Path, smollm2_dir: Path
) -> None:
    env = base_env(tmp_path) | {
        "RUBRICEM_AGENT__EMBEDDED_MODEL_PATH": str(smollm2_dir),  # skip a second conversion
        "RUBRICEM_AGENT__EMBEDDED_ADAPTER_PATH": str(SHIPPED_SFT_ADAPTER),  # what the bundled model loads by default
        # Small budgets, as in tests/ui/test_ui_browser.py: with seed 1 the answer restates the retrieved Frozen
        # passage closely enough to be matched to it after writing.
        "RUBRICEM_AGENT__DEFAULTS__TOKEN_CAPS__PLAN": "16",
        "RUBRICEM_AGENT__DEFAULTS__TOKEN_CAPS__RESEARCH": "24",
        "RUBRICEM_AGENT__DEFAULTS__TOKEN_CAPS__REVIEW": "16",
        "RUBRICEM_AGENT__DEFAULTS__TOKEN_CAPS__ANSWER": "64",
        "RUBRICEM_AGENT__LOCAL_SEARCH_K": "2",
        "RUBRICEM_AGENT__SNIPPET_CHARS": "400",
    }
    params = StdioServerParameters(command=sys.executable, args=["-m", "app.cli", "mcp"], env=env, cwd=ROOT)
    progress: list[str] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append(message or "")

    async def drive() -> tuple[list[str], Any, Any]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            names = sorted(t.name for t in (await session.list_tools()).tools)
            result = await session.call_tool(
                "research", {"question": "What is the 2013 film Frozen about?",
                             # The one call is the model's own (question_first off, an option MCP passes through):
                             # the seeded sample this test pins writes a cited answer on that path.
                             "options": {"max_tool_calls": 1, "seed": 1, "inject_bank": False,
                                         "question_first": False}},
                progress_callback=on_progress)
            sid = (result.structured_content or {}).get("session_id", "")
            stored = await session.call_tool("get_session", {"session_id": sid})
            return names, result, stored

    names, result, stored = asyncio.run(drive())
    assert names == ["get_session", "research", "search_bank"]
    assert not result.is_error, result.content
    out = result.structured_content
    assert out is not None and out["session_id"] and out["policy_version"]
    assert out["references"], out["report"]  # numbered references, here matched after writing
    # the invented ids' count, as `ask --json` gives it (issue 64), agrees with the report's own line
    invented = out["invented_citations"]
    assert isinstance(invented, int) and (f"Invented citation ids: {invented} " in out["report"] if invented
                                          else "Invented citation ids" not in out["report"])
    first = out["references"][0]
    assert first["number"] == 1 and first["tool"] == "local_search" and first["text"]
    assert "[1]" in out["report"] and f"`{first['id']}`" in out["report"]
    assert out["session_id"] in result.content[0].text  # the text a desktop client shows: the report + session id
    # progress per stage, in order
    stages = [m for m in progress if m in ("plan", "review", "answer") or m.startswith("research")]
    assert stages[0] == "plan" and stages[1].startswith("research") and stages[-2:] == ["review", "answer"]
    assert progress[0] == f"session {out['session_id']} started" and progress[-1] == "done"
    # get_session reads the same session back from the log
    assert not stored.is_error and stored.structured_content["status"] == "completed"
    assert stored.structured_content["source"] == "api"
    assert stored.structured_content["references"] == out["references"]
    assert stored.structured_content["policy_version"] == out["policy_version"]


def test_research_counts_invented_citation_ids_as_ask_json_does(local_tools: dict[str, Any], tmp_path: Path) -> None:
    """Issue 64: `research`'s structured result carries `invented_citations`, the count `ask --json` gives for the
    same session (the scripted model of tests/app/test_cli_evidence.py cites an id no search returned), and so does
    `get_session` when it reads the session back from the log."""
    from mcp import Client

    from agent.config import AgentConfig, RunOptions
    from agent.support import UNSUPPORTED_MARK
    from app.cli.main import ask_payload
    from app.container import Services
    from app.mcp_server import build_server
    from app.settings import Settings
    from store.config import StoreConfig
    from store.embeddings import embed_texts
    from store.registry import Registry
    from store.session_log import SessionLog
    from tests.agent.scripts import well_formed
    from tests.app.recording import RecordingService
    from tests.fakes import ScriptedPolicy

    agent = AgentConfig(defaults=RunOptions(context_tokens=65536, question_first=False))  # as test_cli_evidence
    settings = Settings(agent=agent, store=StoreConfig(data_dir=tmp_path / "data"))
    log = SessionLog(tmp_path / "s.sqlite3")
    policy = ScriptedPolicy(well_formed(n_calls=1))
    research = RecordingService(policy, local_tools, log, agent, embed=embed_texts)  # type: ignore[arg-type]
    services = Services(settings, log, None, local_tools, policy, research, None,  # type: ignore[arg-type]
                        Registry(log))

    async def drive() -> tuple[Any, Any]:
        async with Client(build_server(services)) as client:
            done = await client.call_tool(
                "research", {"question": "What language were books translated into in Haymo's era?"})
            sid = (done.structured_content or {}).get("session_id", "")
            return done, await client.call_tool("get_session", {"session_id": sid})

    result, stored = asyncio.run(drive())
    assert not result.is_error, result.content
    out = result.structured_content
    assert out is not None and len(research.outcomes) == 1
    assert out["invented_citations"] == 1  # the script cites "deadbeef-9", which no search returned
    assert out["invented_citations"] == ask_payload(research.outcomes[0])["invented_citations"]
    assert f"an invented claim {UNSUPPORTED_MARK}." in out["report"] and "Invented citation ids: 1" in out["report"]
    # get_session reads the same count back from the session log
    assert not stored.is_error, stored.content
    assert stored.structured_content["status"] == "completed" and stored.structured_content["invented_citations"] == 1


def test_http_needs_the_token_and_serves_get_session_and_search_bank(tmp_path: Path) -> None:
    port = free_port()
    env = base_env(tmp_path) | {
        # nothing here samples: a policy server that is never called keeps the model out of this test
        "RUBRICEM_AGENT__POLICY_BACKEND": "llamacpp",
        "RUBRICEM_AGENT__POLICY_BASE_URL": f"http://127.0.0.1:{free_port()}",
        "RUBRICEM_MCP__TOKEN": TOKEN,
    }
    log = (tmp_path / "mcp.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "mcp", "--transport", "http", "--port", str(port)],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        _wait_listening(proc, port, tmp_path / "mcp.log")
        assert asyncio.run(_status_without_token(url)) == 401

        async def drive() -> tuple[list[str], Any, Any, Any]:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with (httpx2.AsyncClient(headers=headers, timeout=60) as http,
                        streamable_http_client(url, http_client=http) as (read, write),
                        ClientSession(read, write) as session):
                await session.initialize()
                names = sorted(t.name for t in (await session.list_tools()).tools)
                missing = await session.call_tool("get_session", {"session_id": "no-such-session"})
                empty = await session.call_tool("search_bank", {"query": "films", "k": 3})
                bad = await session.call_tool("research", {"question": "   "})
                return names, missing, empty, bad

        names, missing, empty, bad = asyncio.run(drive())
        assert names == ["get_session", "research", "search_bank"]
        assert missing.is_error and "no session with id 'no-such-session'" in missing.content[0].text
        assert not empty.is_error and empty.structured_content == {"hits": []}
        assert bad.is_error and "the question is empty" in bad.content[0].text
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
    assert TOKEN not in (tmp_path / "mcp.log").read_text()


def test_http_off_loopback_without_a_token_is_refused_before_anything_loads(tmp_path: Path) -> None:
    p = rubricem(["mcp", "--transport", "http", "--host", "0.0.0.0"], base_env(tmp_path))
    assert p.returncode == 2 and "without a token" in p.stderr and "RUBRICEM_MCP__TOKEN" in p.stderr
    assert not (tmp_path / "data").exists()


async def _status_without_token(url: str) -> int:
    async with httpx2.AsyncClient(timeout=30) as http:
        body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
        response = await http.post(url, json=body, headers={"Accept": "application/json, text/event-stream"})
        return response.status_code


def _wait_listening(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    """Wait until the server accepts connections (it indexes the bundled corpus first)."""
    import socket
    import time

    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"rubricem mcp exited with {proc.returncode}:\n{log.read_text()[-3000:]}", pytrace=False)
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    pytest.fail(f"rubricem mcp did not listen within {START_S:.0f} s:\n{log.read_text()[-3000:]}", pytrace=False)
