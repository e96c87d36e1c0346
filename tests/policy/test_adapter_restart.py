"""Adapters survive a vLLM restart (issue 63, item 4), against the vLLM stand-in (tests/vllm_server.py), which restarts
as a new server on the same port without its runtime-loaded adapters, as vLLM does (the real-vLLM version of the
service test is tests/app/test_vllm_loop.py::test_after_a_vllm_restart_the_next_team_session_is_served_by_its_adapter).

A request that names an adapter the server lost gets vLLM's 404 "The model `x` does not exist."; the client loads
the adapter again from its folder (the one it loaded it from, or the one the request is pinned to) and sends the
request once more. A name with no known folder still fails with the 404, and a folder that is gone is named."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from agent.config import AgentConfig, RunOptions, StageTokenCaps
from agent.errors import PolicyRequestError
from agent.policy import VLLMPolicyClient
from agent.protocols import ChatMessage, Served
from app.service import ResearchService
from store.owner import acting_as
from store.registry import Registry
from store.session_log import SessionLog
from store.teams import Teams
from store.users import Users
from tests.policy.test_vllm_server import research_script
from tests.vllm_server import VLLMStandInServer

MESSAGES = [ChatMessage("user", "Who wrote Hamlet?")]
OPTIONS = RunOptions(
    format="short_form", max_tool_calls=1, temperature=0.0, seed=0, wall_clock_s=120,
    token_caps=StageTokenCaps(plan=64, research=32, review=32, answer=32), context_tokens=4096,
)  # fmt: skip
ADAPTER = "team:law@1"


class Restartable:
    """A stand-in that can be restarted on its port, losing its runtime-loaded adapters (as vLLM does)."""

    def __init__(self, tokenizer_dir: Path) -> None:
        self.tokenizer_dir = tokenizer_dir
        self.server = VLLMStandInServer(tokenizer_dir, script=research_script).start()
        self.url = self.server.url

    def restart(self) -> VLLMStandInServer:
        port = urlsplit(self.url).port
        self.server.stop()
        self.server = VLLMStandInServer(self.tokenizer_dir, script=research_script).start(port or 0)
        assert self.server.url == self.url and self.server.adapters == {}
        return self.server

    def stop(self) -> None:
        self.server.stop()


@pytest.fixture
def vllm(smollm2_dir: Path) -> Iterator[Restartable]:
    server = Restartable(smollm2_dir)
    yield server
    server.stop()


def _client(url: str) -> VLLMPolicyClient:
    return VLLMPolicyClient(url, "policy", timeout_s=30, max_retries=3, backoff_s=0.01, backoff_max_s=0.05)


def test_a_pinned_request_loads_the_adapter_again_after_a_restart_and_is_served_by_it(
        vllm: Restartable, tmp_path: Path) -> None:
    folder = str(vllm.server.add_adapter_dir(tmp_path / "law1"))

    async def go() -> tuple[str, str]:
        client = _client(vllm.url)
        try:
            assert await client.ensure_adapter(ADAPTER, folder)
            ctx = await client.render_prompt(MESSAGES)
            served = Served(ADAPTER, ADAPTER, folder)
            before = await client.generate(ctx, stop=["</answer>"], max_tokens=48, temperature=0.0, served=served)
            vllm.restart()
            after = await client.generate(ctx, stop=["</answer>"], max_tokens=48, temperature=0.0, served=served)
            return before.text, after.text
        finally:
            await client.aclose()

    before, after = asyncio.run(go())
    assert f"[{ADAPTER}]" in before and after == before  # served by the adapter again, not a 404, not the base
    assert vllm.server.adapters == {ADAPTER: folder}
    assert [m.model for m in vllm.server.served] == [ADAPTER]


def test_a_client_that_never_loaded_it_reloads_from_the_folder_the_request_is_pinned_to(
        vllm: Restartable, tmp_path: Path) -> None:
    """A new serving process after both restarted: it knows the team's folder only from the registry (`Served`)."""
    folder = str(vllm.server.add_adapter_dir(tmp_path / "law1"))
    vllm.restart()

    async def go() -> str:
        client = _client(vllm.url)
        try:
            ctx = await client.render_prompt(MESSAGES)
            gen = await client.generate(ctx, stop=["</answer>"], max_tokens=48, temperature=0.0,
                                        served=Served(ADAPTER, ADAPTER, folder))
            return gen.text
        finally:
            await client.aclose()

    assert f"[{ADAPTER}]" in asyncio.run(go())
    assert vllm.server.adapters == {ADAPTER: folder}


def test_the_clients_own_alias_is_loaded_again_for_tokenize_and_generate(vllm: Restartable, tmp_path: Path) -> None:
    folder = str(vllm.server.add_adapter_dir(tmp_path / "p1"))

    async def go() -> str:
        client = _client(vllm.url)
        try:
            await client.aload_adapter(folder, "policy@1")
            vllm.restart()
            ctx = await client.render_prompt(MESSAGES)  # /tokenize names the alias: restored here already
            gen = await client.generate(ctx, stop=["</answer>"], max_tokens=48, temperature=0.0)
            assert client.known_adapters() == {"policy@1": folder}
            return gen.text
        finally:
            await client.aclose()

    assert "[policy@1]" in asyncio.run(go())
    assert vllm.server.adapters == {"policy@1": folder}


def test_an_unknown_name_still_gets_the_404_and_a_folder_that_is_gone_is_named(
        vllm: Restartable, tmp_path: Path) -> None:
    folder = vllm.server.add_adapter_dir(tmp_path / "gone")

    async def go() -> tuple[str, str]:
        client = _client(vllm.url)
        try:
            ctx = await client.render_prompt(MESSAGES)
            with pytest.raises(PolicyRequestError) as unknown:
                await client.generate(ctx, stop=[], max_tokens=8, temperature=0.0,
                                      served=Served("policy@9", "policy@9", None))
            await client.ensure_adapter(ADAPTER, folder)
            vllm.restart()
            shutil.rmtree(folder)
            with pytest.raises(PolicyRequestError) as gone:
                await client.generate(ctx, stop=[], max_tokens=8, temperature=0.0,
                                      served=Served(ADAPTER, ADAPTER, str(folder)))
            return str(unknown.value), str(gone.value)
        finally:
            await client.aclose()

    unknown, gone = asyncio.run(go())
    assert unknown.startswith("POST /v1/completions: 404") and "does not exist" in unknown
    assert "loading adapter 'team:law@1' again" in gone and str(folder) in gone and "does not exist" in gone
    assert vllm.server.adapters == {}


def test_after_a_restart_the_next_team_session_is_served_by_its_teams_adapter(vllm: Restartable,
                                                                             tmp_path: Path) -> None:
    """The serving path: ResearchService pins a team member's session to the team's version. The service loaded the
    team's adapter once (and remembers that for the life of the process); after the server restarts the next session
    is still served by the team's adapter: not a 404, and not the global policy."""
    log = SessionLog(tmp_path / "log.sqlite3")
    reg, teams = Registry(log), Teams(log)
    Users(log).add("alice", password="alice's password")
    teams.add("law")
    teams.assign("alice", "law")
    folder = vllm.server.add_adapter_dir(tmp_path / "adapters" / "law1")
    law = reg.register(folder, parent="base", team="law")
    reg.promote(law.name)
    client = _client(vllm.url)
    service = ResearchService(client, {}, log, AgentConfig(policy_backend="vllm", policy_model="policy"), live=reg)

    async def ask() -> str:
        with acting_as("alice"):
            return (await service.run("Which language did Haymo of Faversham write in?", OPTIONS,
                                      source="cli")).session_id

    async def go() -> list[str]:
        try:
            first = await ask()
            vllm.restart()
            return [first, await ask()]
        finally:
            await client.aclose()

    sids = asyncio.run(go())
    for sid in sids:
        rec = log.get(sid)
        assert rec.status == "completed" and rec.policy_version == law.name and rec.team == "law"
        assert rec.metrics["serving"] == {"version": law.name, "team": "law", "warning": None}
        assert {t.policy_version for t in rec.trajectory.turns if t.kind == "sampled"} == {law.name}
    after = vllm.server
    assert after.adapters == {law.name: str(folder)}
    assert after.served and {s.model for s in after.served} == {law.name}  # every completion: the team's adapter
