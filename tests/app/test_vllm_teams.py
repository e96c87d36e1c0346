"""Adapters per team on the real vLLM (issue 49): two teams' sessions run at once, each served by its own adapter by
name (the server's request log and the session records agree), a team's cycle promotes only that team's version and
leaves the other team's adapter loaded, a team's rollback leaves the other team alone, and deleting a person's data
marks the team versions their session trained. The sessions are batched by vLLM with its own log-probs, and the
cycle's rollouts are vLLM's, on the run's published step-0 adapter, unloaded when the run ends (these were
`tests/app/test_vllm_loop.py`'s global cycle; promotion, serving and rollback of a global version on vLLM are
`tests/app/test_replica_promotion.py`'s)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.config import SHIPPED_SFT_ADAPTER, AgentConfig, RunOptions, StageTokenCaps
from app.settings import Settings
from learning.config import LearningConfig, RetrainConfig
from store.config import StoreConfig
from store.deletion import delete_user_data, versions_trained_on_deleted_data
from store.owner import acting_as
from store.registry import Registry
from store.session_log import SessionLog
from store.teams import Teams
from store.users import Users
from tests.adapters import scaled_adapter, served_adapters, unload_adapters
from tests.indexes import seed_passages

pytestmark = pytest.mark.slow

SMALL = RunOptions(format="short_form", max_tool_calls=1, temperature=0.7, seed=1, wall_clock_s=600,
                   token_caps=StageTokenCaps(plan=24, research=16, review=16, answer=24), context_tokens=4096)
_LOGGED = re.compile(r"Received request \S+: params: SamplingParams\(.*?\bseed=(\d+),.*?"
                     r"lora_request: (?:None|LoRARequest\(lora_name='([^']*)')")
SEEDS = {"alice": 1_000, "bob": 2_000, "dave": 3_000}  # each session's requests carry seeds from its own base


def logged_requests(server: Any, since: int) -> list[tuple[int, str]]:
    """Generation requests the server logged (`--enable-log-requests`) after byte `since` of its log: each one's
    seed and the adapter that served it ("" for the base model)."""
    text = Path(server.log_path).read_bytes()[since:].decode("utf-8", "replace")
    return [(int(m.group(1)), m.group(2) or "") for m in _LOGGED.finditer(text)]


def _settings(server: Any, smollm2_dir: Path, tmp_path: Path) -> Settings:
    probes = tmp_path / "probes.txt"
    probes.write_text("Who was Haymo of Faversham?\n")
    seed = tmp_path / "seed.txt"
    seed.write_text("What is the Franciscan order?\nWho founded the Franciscan order?\n")
    retrain = RetrainConfig(steps=1, rollouts=2, batch_questions=1, max_token_caps=16, probe_questions=probes,
                            seed_questions=seed, probe_samples=1, tolerance=1.0, min_new_sessions=1,
                            unload_grace_s=0)
    agent = AgentConfig(policy_backend="vllm", policy_base_url=server.url, policy_model="policy",
                        embedded_model_path=smollm2_dir, defaults=SMALL, policy_max_retries=1,
                        local_search_k=2, snippet_chars=300)
    settings = Settings(agent=agent, store=StoreConfig(data_dir=tmp_path / "data"),
                        learning=LearningConfig(retrain=retrain))
    seed_passages(settings)
    return settings


def test_two_teams_are_served_at_once_by_their_own_adapters_and_trained_apart(
        real_vllm: Any, smollm2_dir: Path, tmp_path: Path) -> None:
    try:
        _teams_on_vllm(real_vllm, smollm2_dir, tmp_path)
    finally:
        unload_adapters(real_vllm)


def _teams_on_vllm(server: Any, smollm2_dir: Path, tmp_path: Path) -> None:
    from app.container import build
    from app.scheduler import run_cycle

    settings = _settings(server, smollm2_dir, tmp_path)
    log = SessionLog(settings.store.sqlite_path)
    reg, teams, users = Registry(log), Teams(log), Users(log)
    for name in ("alice", "bob", "dave"):
        users.add(name, password=f"{name}'s password", consent=True)
    teams.add("law")
    teams.add("bio")
    teams.assign("alice", "law")
    teams.assign("bob", "bio")
    law1 = reg.register(scaled_adapter(SHIPPED_SFT_ADAPTER, tmp_path / "law1", 0.5), parent="base", team="law")
    bio1 = reg.register(scaled_adapter(SHIPPED_SFT_ADAPTER, tmp_path / "bio1", 2.0), parent="base", team="bio")
    reg.promote(law1.name)
    reg.promote(bio1.name)

    async def ask_at_once() -> list[str]:
        services = build(settings)

        async def ask(who: str, question: str) -> str:
            with acting_as(who):
                options = SMALL.model_copy(update={"seed": SEEDS[who]})
                return (await services.research.run(question, options, source="chat")).session_id

        try:
            return list(await asyncio.gather(ask("alice", "Who was Haymo of Faversham?"),
                                             ask("bob", "What is a Franciscan friar?"),
                                             ask("dave", "Where was the PRIVATE-GLOBAL-3 abbey built?")))
        finally:
            await services.policy.aclose()

    since = Path(server.log_path).stat().st_size
    sids = asyncio.run(ask_at_once())
    records = [log.get(s) for s in sids]
    assert [r.policy_version for r in records] == [law1.name, bio1.name, "policy"]
    assert [r.team for r in records] == ["law", "bio", None]
    logged = logged_requests(server, since)
    for who, rec in zip(SEEDS, records, strict=True):
        sampled = [t for t in rec.trajectory.turns if t.kind == "sampled"]
        assert sampled and {t.policy_version for t in sampled} == {rec.policy_version}
        assert all(t.token_source == "server" and len(t.logprobs) == len(t.token_ids) for t in sampled)
        # The server's own log: every request of this session (its seeds) was served by the version it recorded.
        mine = [adapter for seed, adapter in logged if SEEDS[who] <= seed < SEEDS[who] + 1_000]
        assert len(mine) >= len(sampled) and set(mine) == {"" if rec.policy_version == "policy" else rec.policy_version}
    assert len(logged) == sum(1 for seed, _ in logged if any(b <= seed < b + 1_000 for b in SEEDS.values()))
    assert {law1.name, bio1.name} <= set(served_adapters(server))  # loaded side by side

    # A cycle of law's: trained on alice's session (and the seed question) from law's live version, gated, promoted
    # as law's; bio's adapter stays loaded and bio's and the global alias do not move.
    result = asyncio.run(run_cycle(settings, trigger="cli", force=True, team="law"))
    cycle = result.cycle
    assert cycle.status == "promoted" and cycle.team == "law", result.message
    rollouts = SessionLog(settings.store.data_dir / "runs" / cycle.cycle_id / "rollouts.sqlite3")
    rollout_versions = {t.policy_version for s in rollouts.list_sessions(limit=100)
                        for t in rollouts.get(s.session_id).trajectory.turns if t.kind == "sampled"}
    assert rollout_versions == {f"{cycle.cycle_id}@0"}  # vLLM's rollouts, on the run's published step-0 adapter
    models = [c["id"] for c in httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"]]
    assert not any(m.startswith(f"{cycle.cycle_id}@") for m in models)  # the step adapters left the server
    law2 = reg.live("law")
    assert law2.name == "team:law@2" and law2.parent == law1.name
    # It trained on law's window only: alice's session, never bob's (bio) or dave's (the global policy), whose
    # session stays in the global window; its questions are hers plus the seed set.
    assert reg.sessions_in_window(cycle.window_start, cycle.window_end, team="law") == [sids[0]]
    assert reg.sessions_in_window(None, log.now()) == [sids[2]]
    trained_on = [json.loads(line)["question"] for line in
                  (settings.store.data_dir / "runs" / cycle.cycle_id / "questions.jsonl").read_text().splitlines()]
    assert "Who was Haymo of Faversham?" in trained_on
    assert not {"What is a Franciscan friar?", "Where was the PRIVATE-GLOBAL-3 abbey built?"} & set(trained_on)
    # Gated twice: on law's own recent questions, and on the global probe set against what law is served now.
    report = law2.eval_report or {}
    assert "team questions:" in report["reason"] and report["general"]["live"]["version"] == law1.name
    assert reg.live("bio").name == bio1.name and reg.live().name == "base"
    served = served_adapters(server)
    assert {law2.name, law1.name, bio1.name} <= set(served)  # law@1 stays for a rollback; bio's is never unloaded

    back = reg.rollback("test", team="law")
    assert (back.version, back.previous) == (law1.name, law2.name) and reg.live("bio").name == bio1.name

    # Deleting alice's data marks law@2 (its window held her session), never bio's version.
    marked = delete_user_data(log, "alice", requested_by="root").marked_versions
    assert law2.name in marked and bio1.name not in versions_trained_on_deleted_data(log)
