"""Bank items never carry one person's words into another's prompt (issue 18): a reflection made from a question
(and a report) holding a distinctive string is injected into another person's run through the real research service
and ScriptedPolicy; the prompt gets its rubrics and takeaways, never the question or the report text."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent.config import AgentConfig, RunOptions, StageTokenCaps
from app.container import open_bank
from app.service import ResearchService
from app.settings import Settings
from store.config import StoreConfig
from store.owner import acting_as
from store.records import BankItem, PromptRecord
from store.rubric_bank import RubricBank
from store.session_log import SessionLog
from tests.agent.scripts import well_formed
from tests.fakes import ScriptedPolicy

SECRET = "QUOKKA-ZEPHYR-4471"
ALICE_Q = f"What language were books translated into in the era of Haymo of Faversham, inquires {SECRET}?"
BOB_Q = "Into which language were books translated in the time of Haymo of Faversham?"
OPTIONS = RunOptions(format="short_form", max_tool_calls=1, temperature=0.0, seed=0, wall_clock_s=300,
                     token_caps=StageTokenCaps(plan=40, research=24, review=24, answer=40), context_tokens=8192)


def test_a_reflection_from_one_persons_question_reaches_another_without_their_words(
        local_tools: dict, tmp_path: Path) -> None:  # type: ignore[type-arg]
    log = SessionLog(tmp_path / "s.sqlite3")
    bank = open_bank(Settings(store=StoreConfig(data_dir=tmp_path / "bank")), log=log)  # as the app opens it
    alice = log.create_session(ALICE_Q, PromptRecord("p", (1,), "s"), {}, "base", owner="alice", source="chat")
    log.finish(alice, "completed", report=f"Latin, as {SECRET}'s notes say.")
    item = BankItem.new(question=ALICE_Q, rubrics="Critical Requirement: RUBRIC-MARK name the language",
                        takeaways="1. TAKEAWAY-MARK search the friar's biography first.", score=0.8,
                        judge_model="judge", policy_version="base", session_id=alice)
    bank.put(item)

    svc = ResearchService(ScriptedPolicy(well_formed()), local_tools, log, AgentConfig(), bank)  # type: ignore[arg-type]
    with acting_as("bob"):
        out = asyncio.run(svc.run(BOB_Q, OPTIONS, lambda _e: None, source="chat"))
    rec = log.get(out.session_id)
    prompt = rec.trajectory.prompt.text
    assert rec.owner == "bob" and rec.trajectory.injected_bank_items == (item.id,)
    assert "RUBRIC-MARK" in prompt and "TAKEAWAY-MARK" in prompt  # the rubrics and takeaways travel ...
    assert SECRET not in prompt and "inquires" not in prompt  # ... alice's question does not
    assert "notes say" not in prompt  # nor her report
    assert SECRET not in repr(rec.metrics) and SECRET not in repr(rec.options)
    assert all(SECRET not in t.text for t in rec.trajectory.turns)

    # Alice asking her own question again gets her own reflection (within-episode), as before.
    with acting_as("alice"):
        again = asyncio.run(svc.run(ALICE_Q, OPTIONS, lambda _e: None, source="chat"))
    assert log.get(again.session_id).trajectory.injected_bank_items == (item.id,)


def test_nobody_can_tell_from_the_bank_whether_someone_else_asked_a_question(
        local_tools: dict, tmp_path: Path) -> None:  # type: ignore[type-arg]
    """Issue 34: a same-question (within-episode) hit is only ever the asker's own item. Bob asking alice's exact
    question, or it with one word changed (the bank's own "same question in other words"), gets no sign of hers."""
    log = SessionLog(tmp_path / "s.sqlite3")
    bank = open_bank(Settings(store=StoreConfig(data_dir=tmp_path / "bank")), log=log)
    alice = log.create_session(ALICE_Q, PromptRecord("p", (1,), "s"), {}, "base", owner="alice", source="chat")
    log.finish(alice, "completed", report="Latin.")
    item = BankItem.new(question=ALICE_Q, rubrics="Critical Requirement: RUBRIC-MARK name the language",
                        takeaways="1. TAKEAWAY-MARK search the friar's biography first.", score=0.8,
                        judge_model="judge", policy_version="base", session_id=alice)
    bank.put(item)
    orphan = BankItem.new(question=BOB_Q, rubrics="r", takeaways="t", score=0.8, judge_model="judge",
                          policy_version="base", session_id="imported-or-deleted")  # no session: no owner known
    bank.put(orphan)

    svc = ResearchService(ScriptedPolicy(well_formed()), local_tools, log, AgentConfig(), bank)  # type: ignore[arg-type]
    reworded = ALICE_Q.replace("inquires", "asks")
    with acting_as("bob"):
        for question in (ALICE_Q, ALICE_Q.upper(), reworded):
            out = asyncio.run(svc.run(question, OPTIONS, lambda _e: None, source="chat"))
            rec = log.get(out.session_id)
            assert item.id not in rec.trajectory.injected_bank_items and "RUBRIC-MARK" not in rec.trajectory.prompt.text
            assert bank.retrieve(question).mode != "within"
        # An item whose session is unknown is nobody's own: not a same-question hit either (alice's item, a merely
        # similar question's, may still come as a cross-episode reference, without her question: issue 18).
        found = bank.retrieve(BOB_Q)
        assert found.mode == "cross" and orphan.id not in found.item_ids
    with acting_as("alice"):  # hers, to her, as before
        assert bank.retrieve(reworded).item_ids[0] == item.id and bank.retrieve(ALICE_Q).mode == "within"
