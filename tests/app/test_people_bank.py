"""Bank items never carry one person's words into another's prompt (issue 18): a reflection made from a question
(and a report) holding a distinctive string is injected into another person's run through the real research service
and ScriptedPolicy; the prompt gets its rubrics and takeaways, never the question or the report text."""

from __future__ import annotations

import asyncio
from dataclasses import replace
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
    # A shared bank never answers with its last item (issue 46: its end would show what was left out), so one more.
    bank.put(BankItem.new(question="How do you bake sourdough bread at home?", rubrics="r", takeaways="t", score=0.5,
                          judge_model="judge", policy_version="base", session_id=alice))

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


def _world(folder: Path, others: list[BankItem], bob_asked: bool) -> ResearchService:
    """The research service of a deployment whose bank holds `others` (the same ids in every world) and, when
    `bob_asked`, bob's reflection on NEAR_Q."""
    log = SessionLog(folder / "s.sqlite3")
    bank = open_bank(Settings(store=StoreConfig(data_dir=folder / "bank")), log=log)
    carol = log.create_session("carol's questions", PromptRecord("p", (1,), "s"), {}, "base", owner="carol",
                               source="chat")
    for item in others:
        bank.put(replace(item, session_id=carol))
    if bob_asked:
        bob = log.create_session(NEAR_Q, PromptRecord("p", (1,), "s"), {}, "base", owner="bob", source="chat")
        log.finish(bob, "completed", report="Latin.")
        bank.put(BankItem.new(question=NEAR_Q, rubrics="BOB-RUBRIC", takeaways="BOB-TAKEAWAY", score=0.9,
                              judge_model="judge", policy_version="base", session_id=bob))
    return ResearchService(None, {}, log, AgentConfig(), bank)  # type: ignore[arg-type]


NEAR_Q = "Into which language were the books translated in the time of Haymo of Faversham?"  # BOB_Q, reworded


def test_the_reflections_used_do_not_tell_whether_someone_asked_a_near_identical_question(tmp_path: Path) -> None:
    """Issue 46, item 2: the chat says "Used reflections from N similar earlier question(s)", N being what the
    research service's bank retrieval gives (`ResearchService.references`, top 2 by default). Bob's reflection on
    (nearly) alice's question was dropped after the top 2 had been taken, so alice got 1 reflection where a bank
    without bob's got her 2: asking told her that someone had asked it. Both worlds must answer her alike."""
    others = [replace(BankItem.new(question=q, rubrics=f"RUBRIC-{i}", takeaways=f"TAKEAWAY-{i}", score=0.8,
                                   judge_model="judge", policy_version="base", session_id="x"), id=f"bank-other-{i}")
              for i, q in enumerate(("Who was Haymo of Faversham?", "Which order did Haymo of Faversham belong to?",
                                     "When did Haymo of Faversham die?"))]
    answers = []
    for name, bob_asked in (("asked", True), ("not-asked", False)):
        svc = _world(tmp_path / name, others, bob_asked)
        with acting_as("alice"):
            refs = asyncio.run(svc.references(BOB_Q, OPTIONS, lambda _e: None))
        answers.append((refs.mode, [(h.item.id, h.item.question, h.similarity) for h in refs.hits]))
    asked, not_asked = answers
    assert asked == not_asked and len(asked[1]) == 2, answers
    assert all(round(sim, 1) == sim for _, _, sim in asked[1]), asked  # coarse: nothing to climb towards
