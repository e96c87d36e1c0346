"""Issue 34, finding 4: the MCP server respects per-user privacy, driven by the `mcp` SDK's client.

The server is the real `rubricem mcp` command in a subprocess, bound to 127.0.0.2 (a loopback address that is not one
of the three exact open binds, so it needs a token) over a real store seeded with other people's sessions and bank
items. Its policy is a small HTTP server in this test that tokenizes and then holds every completion request until
released, so a `research` call stays in flight without loading a model. The attacks: opening someone else's session,
reading other people's reflections or questions out of the bank (also with a huge k and a negative similarity floor),
replaying the oracle "did someone ask Q?" with an exact, a paraphrased and a wrong guess (issue 65), a foreign Host
header (DNS rebinding), and a second research run past the concurrency limit. Startup refusals (a short token,
127.0.0.2 or a wildcard bind without what they need) are checked without a server.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from learning.reflection.experience import EXPERIENCE_JUDGE
from store import PromptRecord, SessionLog, StoreConfig
from store.records import BankItem
from store.rubric_bank import RubricBank
from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.2"
TOKEN = "mcp-privacy-token-3f9a7c21e4b05d68a1c2"  # 38 characters
START_S = 240.0  # the server indexes the bundled corpus before it listens (two busy cores)
PROMPT = PromptRecord(text="p", token_ids=(1,), prompt_sha="s")
SECRET = "WOMBAT-QUASAR-8812"
ALICE_Q = f"Which river flows past the town where {SECRET} grew up?"
LOCAL_Q = f"What did {SECRET} write about medieval Kent?"
MCP_Q = "Who was Haymo of Faversham?"
CAROL_Q = "How do you bake sourdough bread at home?"  # far from every query below
UNASKED_Q = "How do glaciers carve a valley?"  # nobody asked anything like it
PARAPHRASE_Q = f"{SECRET} grew up in a town on which river?"  # MiniLM cosine 0.92 to ALICE_Q, under the bank's 0.97


# ---- a policy server that holds completions ---------------------------------------------------------------------


class StalledPolicy:
    """llama.cpp's two endpoints as a real HTTP server: `/extras/tokenize` answers at once (one id per character,
    none for the empty string), `/v1/completions` waits until `release()` and then answers 503, so a research run
    sits in its first generation for as long as a test needs and then fails."""

    def __init__(self) -> None:
        self.generating = threading.Event()
        self.released = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
                if self.path == "/extras/tokenize":
                    self._answer(200, {"tokens": [ord(c) % 1000 + 1 for c in str(body.get("input", ""))]})
                    return
                outer.generating.set()
                outer.released.wait(timeout=300)
                self._answer(503, {"error": "the test released this request"})

            def _answer(self, status: int, data: dict[str, Any]) -> None:
                raw = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def release(self) -> None:
        self.released.set()

    def close(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()


# ---- the server under test ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Served:
    url: str
    port: int
    data: Path
    policy: StalledPolicy
    alice_sid: str
    local_sid: str
    mcp_sid: str


def base_env(data: Path) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("RUBRICEM_")} | {
        "HF_HUB_OFFLINE": "1", "RUBRICEM_STORE__DATA_DIR": str(data)}


def _seed(data: Path) -> tuple[str, str, str]:
    """Alice's, the operator's (`local`) and carol's sessions and one of the MCP identity's, each with a bank item;
    returns the first three's ids."""
    sids = []
    bank = RubricBank(StoreConfig(data_dir=data))
    with SessionLog(data / "rubricem.sqlite3") as log:
        for owner, question in (("alice", ALICE_Q), ("local", LOCAL_Q), ("mcp", MCP_Q), ("carol", CAROL_Q)):
            sid = log.create_session(question, PROMPT, {}, "base", owner=owner, source="chat")
            log.finish(sid, "completed", report=f"{owner}'s report")
            bank.put(BankItem.new(question=question, rubrics=f"RUBRIC-{owner}", takeaways=f"TAKEAWAY-{owner}",
                                  score=0.8, judge_model="judge", policy_version="base", session_id=sid))
            sids.append(sid)
        # carol's experience item (issue 62) quotes her search on a question near alice's: it is hers alone
        sid = log.create_session(f"Where did {SECRET} grow up?", PROMPT, {}, "base", owner="carol", source="chat")
        log.finish(sid, "completed", report="carol's report")
        bank.put(BankItem.new(question=f"Where did {SECRET} grow up?", rubrics="RUBRIC-carol-experience",
                              takeaways=f"searched {SECRET} hometown", score=0.8, judge_model=EXPERIENCE_JUDGE,
                              policy_version="base", session_id=sid))
    del bank
    return sids[0], sids[1], sids[2]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("mcp-privacy")
    data = tmp / "data"
    alice_sid, local_sid, mcp_sid = _seed(data)
    policy = StalledPolicy()
    port = free_port()
    env = base_env(data) | {
        "RUBRICEM_AGENT__POLICY_BACKEND": "llamacpp",
        "RUBRICEM_AGENT__POLICY_BASE_URL": policy.url,
        "RUBRICEM_AGENT__POLICY_MAX_RETRIES": "0",
        "RUBRICEM_MCP__TOKEN": TOKEN,
        "RUBRICEM_MCP__MAX_CONCURRENT_RUNS": "1",
    }
    log_path = tmp / "mcp.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "app.cli", "mcp", "--transport", "http", "--host", HOST,
                                 "--port", str(port)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_listening(proc, port, log_path)
        yield Served(f"http://{HOST}:{port}/mcp", port, data, policy, alice_sid, local_sid, mcp_sid)
    finally:
        policy.close()
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
    assert TOKEN not in log_path.read_text()


def _wait_listening(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    import socket

    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"rubricem mcp exited with {proc.returncode}:\n{log.read_text()[-3000:]}", pytrace=False)
        with socket.socket() as s:
            if s.connect_ex((HOST, port)) == 0:
                return
        time.sleep(0.3)
    pytest.fail(f"rubricem mcp did not listen within {START_S:.0f} s:\n{log.read_text()[-3000:]}", pytrace=False)


async def _calls(url: str, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """Each tool call's result, in one MCP session with the bearer token."""
    async with (httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as http,
                streamable_http_client(url, http_client=http) as (read, write),
                ClientSession(read, write) as session):
        await session.initialize()
        return [await session.call_tool(name, args) for name, args in calls]


def _text(result: Any) -> str:
    return "\n".join(getattr(c, "text", "") for c in result.content) + json.dumps(result.structured_content or {})


# ---- the attacks -------------------------------------------------------------------------------------------------


def test_get_session_opens_only_the_mcp_identitys_sessions(served: Served) -> None:
    alice, local, own, missing = asyncio.run(_calls(served.url, [
        ("get_session", {"session_id": served.alice_sid}), ("get_session", {"session_id": served.local_sid}),
        ("get_session", {"session_id": served.mcp_sid}), ("get_session", {"session_id": "no-such-session"})]))
    # someone else's session is answered exactly like a missing one, so ids cannot be probed
    answers = {_text(r).replace(sid, "ID") for sid, r in
               ((served.alice_sid, alice), (served.local_sid, local), ("no-such-session", missing))}
    assert len(answers) == 1 and "no session with id 'ID'" in answers.pop()
    assert alice.is_error and local.is_error and SECRET not in _text(alice) + _text(local)
    assert not own.is_error, _text(own)
    assert own.structured_content["question"] == MCP_Q and own.structured_content["report"] == "mcp's report"


def test_search_bank_returns_only_the_callers_own_items(served: Served) -> None:
    """Issue 65: others' reflections came back with their stable item ids (questions withheld), so a caller could
    watch one item appear and disappear as it guessed. Now the bank shows the MCP identity its own items only."""
    broad, exact = asyncio.run(_calls(served.url, [("search_bank", {"query": "a river in Kent", "k": 10}),
                                                   ("search_bank", {"query": ALICE_Q, "k": 10})]))
    for result in (broad, exact):
        assert not result.is_error, _text(result)
        hits = result.structured_content["hits"]
        assert [h["rubrics"] for h in hits] == ["RUBRIC-mcp"], hits  # alice's, local's and carol's are not shown
        assert hits[0]["question"] == MCP_Q and hits[0]["created_at"]  # its own, to see in full
    assert SECRET not in _text(broad) + _text(exact)


def test_replaying_the_oracle_through_search_bank(served: Served) -> None:
    """Issue 65, finding 1: for alice's question, the exact guess left her item out (the 0.97 hide rule), a
    paraphrase at cosine 0.92 returned it as the top hit, by its id, and a wrong guess returned it lower down. All
    three must answer alike; what may differ is only the similarity of the caller's own items to the query."""
    out = asyncio.run(_calls(served.url, [("search_bank", {"query": q, "k": k})
                                          for k in (1, 5) for q in (ALICE_Q, PARAPHRASE_Q, UNASKED_Q)]))
    assert not any(r.is_error for r in out), [_text(r) for r in out]

    def answer(result: Any) -> list[tuple[Any, ...]]:
        return [(h["id"], h["question"], h["rubrics"], h["takeaways"], h["score"], h["created_at"])
                for h in result.structured_content["hits"]]

    for per_k in (out[:3], out[3:]):
        exact, paraphrase, wrong = (answer(r) for r in per_k)
        assert exact == paraphrase == wrong, (exact, paraphrase, wrong)
        assert [h[2] for h in exact] == ["RUBRIC-mcp"]
    assert SECRET not in "".join(json.dumps(answer(r)) for r in out)


def test_search_bank_answers_alike_whether_or_not_someone_asked(served: Served) -> None:
    """Issue 46, item 2: other people's reflections on (nearly) the query were dropped after the top k had been
    taken, so with k = 1 alice's exact question gave 0 hits where any question nobody asked gave 1, and 4-decimal
    similarities let a caller climb towards a hidden question. Now every k answers as many hits for her question as
    for one nobody asked, on a 0.1 grid, and the similarity floor compares with the coarse value."""
    ks = range(1, 6)
    out = asyncio.run(_calls(served.url, [("search_bank", {"query": q, "k": k}) for q in (ALICE_Q, UNASKED_Q)
                                          for k in ks]))
    assert not any(r.is_error for r in out), [_text(r) for r in out]
    asked, unasked = ([len(r.structured_content["hits"]) for r in part] for part in (out[:len(ks)], out[len(ks):]))
    assert asked == unasked, (asked, unasked)
    assert asked[0] == 1
    hits = [h for r in out for h in r.structured_content["hits"]]
    assert "RUBRIC-alice" not in {h["rubrics"] for r in out[:len(ks)] for h in r.structured_content["hits"]}
    assert all(round(h["similarity"], 1) == h["similarity"] for h in hits), hits
    # A floor a hair above a shown similarity leaves that hit out, so bisecting the floor finds nothing finer.
    best = out[len(ks)].structured_content["hits"][0]
    (floored,) = asyncio.run(_calls(served.url, [("search_bank", {"query": UNASKED_Q, "k": 1,
                                                                   "min_similarity": best["similarity"] + 0.01})]))
    assert best["id"] not in {h["id"] for h in floored.structured_content["hits"]}, _text(floored)


def test_search_bank_refuses_a_large_k_and_a_negative_similarity_floor(served: Served) -> None:
    many, negative, ok = asyncio.run(_calls(served.url, [
        ("search_bank", {"query": "Faversham", "k": 50}),
        ("search_bank", {"query": "Faversham", "min_similarity": -1.0}),
        ("search_bank", {"query": "Faversham", "k": 1})]))
    assert many.is_error and "k" in _text(many) and "10" in _text(many), _text(many)
    assert negative.is_error and "min_similarity" in _text(negative) and "0" in _text(negative), _text(negative)
    assert not ok.is_error and len(ok.structured_content["hits"]) == 1


def test_a_foreign_host_or_origin_header_is_refused(served: Served) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    base = {"Accept": "application/json, text/event-stream", "Authorization": f"Bearer {TOKEN}"}

    async def post(**headers: str) -> int:
        async with httpx2.AsyncClient(timeout=30) as http:
            return (await http.post(served.url, json=body, headers=base | headers)).status_code

    # a page on attacker.example whose name was rebound to 127.0.0.2 sends its own name as Host (and Origin)
    assert asyncio.run(post(Host=f"attacker.example:{served.port}")) == 421
    assert asyncio.run(post(Origin=f"http://attacker.example:{served.port}")) == 403
    assert asyncio.run(post()) == 200  # the bind address itself


def test_research_runs_as_the_mcp_identity_and_a_run_over_the_limit_is_refused(served: Served) -> None:
    async def drive() -> tuple[Any, Any, Any]:
        first = asyncio.create_task(_calls(served.url, [("research", {"question": MCP_Q})]))
        if not await asyncio.to_thread(served.policy.generating.wait, 120):
            first.cancel()
            pytest.fail("the first research run never reached its first generation", pytrace=False)
        try:
            # the old server started a second run too (it would wait on the held policy: the timeout says so)
            (second,) = await asyncio.wait_for(_calls(served.url, [("research", {"question": "Another one?"})]), 30)
        finally:
            served.policy.release()
        (done,) = await asyncio.wait_for(first, 120)
        sid = _text(done).split("session ")[-1].split(" is marked failed")[0]
        (reread,) = await _calls(served.url, [("get_session", {"session_id": sid})])
        return second, done, reread

    second, done, reread = asyncio.run(drive())
    assert second.is_error and "busy" in _text(second) and "RUBRICEM_MCP__MAX_CONCURRENT_RUNS=1" in _text(second)
    assert done.is_error and "is marked failed" in _text(done), _text(done)
    # the session the MCP server created is its identity's, not the CLI's `local`, and it can read it back
    assert not reread.is_error and reread.structured_content["status"] == "failed", _text(reread)
    assert reread.structured_content["invented_citations"] is None  # no report, so nothing to count (issue 64)
    with SessionLog(served.data / "rubricem.sqlite3") as log:
        assert log.get(reread.structured_content["session_id"]).owner == "mcp"
        assert all(s.question != "Another one?" for s in log.list_sessions(limit=50))  # refused: nothing written


# ---- refused at start, before anything loads ----------------------------------------------------------------------


def _start(tmp_path: Path, host: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`rubricem mcp --transport http` that must refuse at once (an old server that started would time out)."""
    e = base_env(tmp_path / "data") | {f"RUBRICEM_MCP__{k.upper()}": v for k, v in env.items()}
    return subprocess.run([sys.executable, "-m", "app.cli", "mcp", "--transport", "http", "--host", host,
                           "--port", str(free_port())], cwd=ROOT, env=e, capture_output=True, text=True, timeout=90)


def test_other_loopback_addresses_need_a_token(tmp_path: Path) -> None:
    p = _start(tmp_path, "127.0.0.2")
    assert p.returncode == 2 and "without a token" in p.stderr and "RUBRICEM_MCP__TOKEN" in p.stderr, p.stderr
    bracketed = _start(tmp_path, "[::1]")
    assert bracketed.returncode == 2 and "write ::1 instead of [::1]" in bracketed.stderr, bracketed.stderr
    assert not (tmp_path / "data").exists()


def test_a_short_token_is_refused_at_start(tmp_path: Path) -> None:
    short = "s3cret-but-short-0123456789abcd"  # 31 characters
    p = _start(tmp_path, "127.0.0.1", token=short)
    assert p.returncode == 2 and "RUBRICEM_MCP__TOKEN is 31 characters" in p.stderr and "32" in p.stderr, p.stderr
    assert short not in p.stderr + p.stdout
    assert not (tmp_path / "data").exists()


def test_a_wildcard_bind_needs_the_allowed_host_names(tmp_path: Path) -> None:
    p = _start(tmp_path, "0.0.0.0", token=TOKEN)
    assert p.returncode == 2 and "RUBRICEM_MCP__ALLOWED_HOSTS" in p.stderr, p.stderr
    assert TOKEN not in p.stderr + p.stdout
    assert not (tmp_path / "data").exists()


def test_a_listed_host_is_allowed_bare_for_a_proxy_and_with_the_port_for_direct_clients() -> None:
    from app.mcp_server import transport_security

    sec = transport_security("10.0.0.5", 8765, ["mcp.example.org"])
    assert sec.enable_dns_rebinding_protection
    assert sec.allowed_hosts == ["10.0.0.5:8765", "mcp.example.org:8765", "mcp.example.org"]
    assert "https://mcp.example.org" in sec.allowed_origins and "http://evil.example" not in sec.allowed_origins
