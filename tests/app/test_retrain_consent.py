"""A real retraining cycle (embedded SmolLM2 on CPU, offline judge, one SS-GRPO step, the gate) with one person who
consents and one who does not: only the consenting person's sessions are judged and trained on (the cycle's data
window, its training questions file and its numbers say so), and the learning-page counts agree."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agent.config import AgentConfig
from app.scheduler import run_cycle
from app.settings import Settings
from learning.config import LearningConfig, RetrainConfig
from store.config import StoreConfig
from store.owner import acting_as
from store.registry import Registry
from store.session_log import SessionLog
from store.users import Users
from tests.app.test_retrain_loop import SMALL
from tests.gate import assert_gate_decided

YES = ("Who was Haymo of Faversham?", "What is the Franciscan order?")
NO = ("Where was the PRIVATE-NO-7 abbey built?", "Who funded the PRIVATE-NO-8 chapel?")


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a few minutes on an idle 2-core machine
def test_a_cycle_trains_only_on_the_consenting_persons_sessions(smollm2_dir: Path, tmp_path: Path) -> None:
    from app.container import build

    probes = tmp_path / "probes.txt"
    probes.write_text("Who was Haymo of Faversham?\n")
    retrain = RetrainConfig(steps=1, rollouts=2, batch_questions=1, max_token_caps=16, probe_questions=probes,
                            probe_samples=1, tolerance=1.0,  # who is learned from is under test, not the gate
                            min_new_sessions=2, unload_grace_s=0)
    settings = Settings(agent=AgentConfig(embedded_model_path=smollm2_dir, defaults=SMALL),
                        store=StoreConfig(data_dir=tmp_path / "data"), learning=LearningConfig(retrain=retrain))
    log = SessionLog(settings.store.sqlite_path)
    Users(log).add("yes@example.org", kind="oidc", consent=True)
    Users(log).add("no@example.org", kind="oidc", consent=False)

    async def ask_all() -> dict[str, str]:
        services = build(settings)
        owners = {}
        try:
            for who, questions in (("yes@example.org", YES), ("no@example.org", NO)):
                for q in questions:
                    with acting_as(who):  # as the chat page does: the session is created for this person
                        out = await services.research.run(q, SMALL, source="chat")
                    owners[out.session_id] = who
            return owners
        finally:
            await services.policy.aclose()

    owners = asyncio.run(ask_all())
    assert sorted(owners.values()) == ["no@example.org"] * 2 + ["yes@example.org"] * 2
    assert {sid: log.get(sid).owner for sid in owners} == owners  # the owner reached the store through the service

    result = asyncio.run(run_cycle(settings, trigger="cli", force=True))
    cycle = result.cycle
    assert cycle.numbers["new_sessions"] == 2 and cycle.numbers["skipped_sessions"] == 2
    reg = Registry(log)
    # Tolerance 1.0 (the test is about whose sessions are used, not the decision): the gate still decides from the
    # scores it recorded, and the decision is exactly the one those scores give.
    assert_gate_decided(reg, cycle, tolerance=1.0)  # the wide tolerance above, checked against the scores
    window = reg.sessions_in_window(cycle.window_start, cycle.window_end)
    assert sorted(window) == sorted(s for s, who in owners.items() if who == "yes@example.org")
    trained_on = [json.loads(line)["question"] for line in
                  (settings.store.data_dir / "runs" / cycle.cycle_id / "questions.jsonl").read_text().splitlines()]
    assert trained_on == list(YES)
    assert reg.get(cycle.candidate or "").data_window["sessions"] == 2  # type: ignore[index]
    for sid, who in owners.items():  # the refusing person's sessions were never judged either
        assert bool(log.judgements(sid)) == (who == "yes@example.org")
    assert not any(line for line in log.sessions_without_reflection() if owners.get(line) == "no@example.org")
