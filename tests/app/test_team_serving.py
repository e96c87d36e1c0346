"""Adapters per team (issue 49), embedded: one in-process SmolLM2 (llama.cpp, the product's default engine) serves
sessions of two teams at once, each by its own version, and a team whose adapter is gone falls back to the global
policy with the warning recorded, never to another team's adapter. (A person without a team is served the global
version by the same path as the fallback.) The fallback is recorded as the session starts, so a session that then
fails keeps it, and the note the chat shows carries an error reference, never the adapter's path or the exception
(issue 65); a resumed session is served its owner's policy of today, not the version of a team they have left.

Real parts: the real ResearchService, registry and SQLite store, the real engine with real LoRA adapters (the shipped
SFT adapter and scaled copies of it), the bundled-corpus search tool."""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
from pathlib import Path

import pytest

from agent.approval import PlanDecision
from agent.config import SHIPPED_SFT_ADAPTER, AgentConfig, RunOptions, StageTokenCaps
from app.durable import DurableSessions
from app.service import ResearchOutcome, ResearchPaused, ResearchService, RunFailedError
from store.config import StoreConfig
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


def _team_version(reg: Registry, folder: Path, team: str) -> str:
    name = reg.register(folder, parent="base", team=team).name
    reg.promote(name)
    return name


def test_a_fallback_is_recorded_as_the_session_starts_and_its_note_names_no_path(
        embedded_policy: object, local_tools: dict[str, object], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """law's adapter folder is gone, so alice's session falls back to the global policy; the global adapter then
    fails to load and the session fails. Its record must still say it fell back and why (it was written only when a
    session completed); the chat note must say so with an error reference, not the folder or the exception."""
    log = SessionLog(tmp_path / "log.sqlite3")
    reg, teams = Registry(log), Teams(log)
    Users(log).add("alice", password="alice's password")
    teams.add("law")
    teams.assign("alice", "law")
    law = _team_version(reg, shutil.copytree(SHIPPED_SFT_ADAPTER, tmp_path / "adapters" / "law"), "law")
    shutil.rmtree(tmp_path / "adapters" / "law")
    broken = shutil.copytree(SHIPPED_SFT_ADAPTER, tmp_path / "adapters" / "global")
    (broken / "adapter_model.safetensors").write_bytes(b"not a safetensors file")  # it cannot load
    glob = reg.register(broken, parent="base").name
    reg.promote(glob)
    service = ResearchService(embedded_policy, local_tools, log, AgentConfig(), live=reg)  # type: ignore[arg-type]
    notes: list[object] = []
    with acting_as("alice"), caplog.at_level(logging.WARNING, logger="app.service"), \
            pytest.raises(RunFailedError) as failed:
        asyncio.run(service.run(QUESTION, TINY, on_event=notes.append, source="cli"))

    assert failed.value.session_id is not None
    rec = log.get(failed.value.session_id)
    assert rec.status == "failed" and rec.policy_version == glob and rec.team == "law"
    serving = rec.metrics["serving"]
    assert serving["version"] == glob and serving["team"] == "law"
    assert law in serving["warning"] and "missing" in serving["warning"] and "global policy" in serving["warning"]

    (note,) = [n for n in notes if getattr(n, "kind", None) == "team_policy_fallback"]
    shown = note.data["error"]  # type: ignore[attr-defined]
    ref = note.data["reference"]  # type: ignore[attr-defined]
    assert shown == f"error reference {ref}; the details are in the app's log" and re.fullmatch(r"[0-9a-f]{8}", ref)
    assert str(tmp_path) not in repr(note.data) and law not in repr(note.data)  # type: ignore[attr-defined]
    logged = [r.getMessage() for r in caplog.records if ref in r.getMessage()]
    assert len(logged) == 1 and str(tmp_path / "adapters" / "law") in logged[0]  # the operator's log has it all


@pytest.mark.slow
def test_a_resumed_session_is_served_its_owners_policy_of_today(smollm2_dir: Path, local_tools: dict[str, object],
                                                                tmp_path: Path) -> None:
    """alice's plan waits for approval, served by law's version; she moves to bio. The rest of the session must be
    served by bio's version, her policy now, not law's (nor, with the resume run by someone else such as the CLI's
    `local`, the resumer's)."""
    from learning.engines.local_policy import TransformersPolicyClient

    log = SessionLog(tmp_path / "log.sqlite3")
    reg, teams = Registry(log), Teams(log)
    Users(log).add("alice", password="alice's password")
    teams.add("law")
    teams.add("bio")
    teams.assign("alice", "law")
    law = _team_version(reg, scaled_adapter(SHIPPED_SFT_ADAPTER, tmp_path / "adapters" / "law", 0.5), "law")
    bio = _team_version(reg, scaled_adapter(SHIPPED_SFT_ADAPTER, tmp_path / "adapters" / "bio", 2.0), "bio")
    client = TransformersPolicyClient(smollm2_dir)
    durable = DurableSessions.for_store(log, StoreConfig(data_dir=tmp_path))
    service = ResearchService(client, local_tools, log, AgentConfig(), live=reg,  # type: ignore[arg-type]
                              durable=durable)
    try:
        with acting_as("alice"):
            paused = asyncio.run(service.start(QUESTION, TINY, approve_plan=True))
        assert isinstance(paused, ResearchPaused)
        sid = paused.session_id
        assert _sampled_versions(log, sid) == {law}
        teams.assign("alice", "bio")
        done = asyncio.run(service.resume(sid, PlanDecision("accept")))  # resumed by the operator, as `local`
        assert isinstance(done, ResearchOutcome)
        rec = log.get(sid)
        after = [t.policy_version for t in rec.trajectory.turns if t.kind == "sampled"][1:]
        assert after and set(after) == {bio}, after
        assert rec.metrics["serving"]["version"] == bio and rec.metrics["serving"]["resumed"] is True
        assert rec.team == "law"  # the session stays with the team it was asked in, for training
    finally:
        asyncio.run(client.aclose())
