"""Adapters per team (issue 49), embedded: one in-process SmolLM2 (llama.cpp, the product's default engine) serves
sessions of two teams at once, each by its own version, and a team whose adapter is gone falls back to the global
policy with the warning recorded, never to another team's adapter. (A person without a team is served the global
version by the same path as the fallback.)

Real parts: the real ResearchService, registry and SQLite store, the real engine with real LoRA adapters (the shipped
SFT adapter and scaled copies of it), the bundled-corpus search tool."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from agent.config import SHIPPED_SFT_ADAPTER, AgentConfig, RunOptions, StageTokenCaps
from app.service import ResearchOutcome, ResearchService
from store.owner import acting_as
from store.registry import Registry
from store.session_log import SessionLog
from store.teams import Teams
from store.users import Users
from tests.adapters import scaled_adapter

TINY = RunOptions(format="short_form", max_tool_calls=1, temperature=0.0, seed=0, wall_clock_s=300,
                  token_caps=StageTokenCaps(plan=16, research=16, review=16, answer=16), context_tokens=8192)
QUESTION = "Who was Haymo of Faversham?"


def _sampled_versions(log: SessionLog, sid: str) -> set[str]:
    return {t.policy_version for t in log.get(sid).trajectory.turns if t.kind == "sampled"}


@pytest.mark.slow
def test_sessions_of_two_teams_run_at_once_each_on_its_own_adapter_and_a_missing_one_falls_back(
        smollm2_dir: Path, smollm2_gguf: Path, local_tools: dict[str, object], tmp_path: Path) -> None:
    from learning.engines.llamacpp_engine import EmbeddedLlamaCppClient

    log = SessionLog(tmp_path / "log.sqlite3")
    reg, teams, users = Registry(log), Teams(log), Users(log)
    for name in ("alice", "bob"):
        users.add(name, password=f"{name}'s password")
    teams.add("law")
    teams.add("bio")
    teams.assign("alice", "law")
    teams.assign("bob", "bio")
    versions = {}
    for team, factor in (("law", 0.5), ("bio", 2.0)):
        folder = scaled_adapter(SHIPPED_SFT_ADAPTER, tmp_path / "adapters" / team, factor)
        versions[team] = reg.register(folder, parent="base", team=team).name
        reg.promote(versions[team])
    client = EmbeddedLlamaCppClient(smollm2_dir, smollm2_gguf, adapter_path=SHIPPED_SFT_ADAPTER, version="sft",
                                    lora_cache=tmp_path / "lora", threads=1, batch_threads=1)
    service = ResearchService(client, local_tools, log, AgentConfig(), live=reg, base_adapter=SHIPPED_SFT_ADAPTER)
    notes: list[object] = []

    async def ask(owner: str) -> ResearchOutcome:
        with acting_as(owner):
            return await service.run(QUESTION, TINY, on_event=notes.append, source="cli")

    async def all_at_once() -> list[ResearchOutcome]:
        return list(await asyncio.gather(ask("alice"), ask("bob")))

    try:
        outs = asyncio.run(all_at_once())
        expected = [versions["law"], versions["bio"]]
        assert [o.policy_version for o in outs] == expected
        for out, version in zip(outs, expected, strict=True):
            rec = log.get(out.session_id)
            # Every sampled token of the session came from its own version, however the four interleaved.
            assert rec.policy_version == version and _sampled_versions(log, out.session_id) == {version}
            assert rec.metrics["serving"]["version"] == version and rec.metrics["serving"]["warning"] is None
        assert [log.get(o.session_id).team for o in outs] == ["law", "bio"]

        shutil.rmtree(tmp_path / "adapters" / "bio")  # bio's adapter is gone: the global policy, never law's
        # (the global live version `base` is the deployment's starting adapter, the SFT one)
        fallback = asyncio.run(ask("bob"))
        rec = log.get(fallback.session_id)
        assert rec.policy_version == "sft" and _sampled_versions(log, fallback.session_id) == {"sft"}
        warning = rec.metrics["serving"]["warning"]
        assert versions["bio"] in warning and "missing" in warning and "global policy" in warning
        assert any(getattr(n, "kind", None) == "team_policy_fallback" for n in notes)
        assert reg.live("law").name == versions["law"]  # the other team is untouched
    finally:
        asyncio.run(client.aclose())
