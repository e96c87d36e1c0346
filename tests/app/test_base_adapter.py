"""The registry's `base` version serves the deployment's starting adapter (the shipped SFT adapter when enabled)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent.config import SHIPPED_SFT_ADAPTER, AgentConfig
from app.container import base_adapter
from app.service import ResearchService
from app.settings import Settings
from store.registry import Registry
from store.session_log import SessionLog


def test_base_adapter_follows_the_settings(tmp_path: Path) -> None:
    # The shipped SFT adapter by default; the plain base model one setting away.
    assert base_adapter(Settings()) == SHIPPED_SFT_ADAPTER and (SHIPPED_SFT_ADAPTER / "adapter_config.json").is_file()
    assert base_adapter(Settings(agent=AgentConfig(embedded_sft=False))) is None
    mine = Settings(agent=AgentConfig(embedded_adapter_path=tmp_path))
    assert base_adapter(mine) == tmp_path
    assert base_adapter(Settings(agent=AgentConfig(embedded_sft=True, policy_backend="vllm"))) is None


def test_live_base_keeps_the_starting_adapter_loaded(smollm2_dir: Path, tmp_path: Path) -> None:
    from learning.engines.local_policy import TransformersPolicyClient

    policy = TransformersPolicyClient(smollm2_dir, adapter_path=SHIPPED_SFT_ADAPTER, version="sft")
    try:
        log = SessionLog(tmp_path / "log.sqlite3")
        registry = Registry(log)
        assert registry.current()[0] == "base"
        notes: list[object] = []
        keep = ResearchService(policy, {}, log, AgentConfig(), live=registry, base_adapter=SHIPPED_SFT_ADAPTER)
        asyncio.run(keep.sync_live(notes.append))
        assert policy.policy_version == "sft" and not notes  # nothing to swap: base *is* this adapter
        plain = ResearchService(policy, {}, log, AgentConfig(), live=registry)
        asyncio.run(plain.sync_live(notes.append))
        assert policy.policy_version == "base"  # without a starting adapter, live base means the plain weights
        asyncio.run(keep.sync_live(notes.append))
        assert policy.policy_version == "sft"  # and back
    finally:
        asyncio.run(policy.aclose())
