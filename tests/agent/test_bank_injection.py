"""Rubric-bank injection into research runs: the `<reference_examples>` block, its preambles and what is recorded."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent.config import AgentConfig, RunOptions, StageTokenCaps
from app import events as ev
from app.service import ResearchService
from store.config import StoreConfig
from store.records import BankItem
from store.rubric_bank import RubricBank
from store.session_log import SessionLog
from tests.agent.scripts import well_formed
from tests.fakes import ScriptedPolicy

QUESTION = "What language were books being translated into during the era of Haymo of Faversham?"
SIMILAR = "Into which language were books translated in the time of Haymo of Faversham?"
OPTIONS = RunOptions(format="short_form", max_tool_calls=1, temperature=0.0, seed=0, wall_clock_s=300,
                     token_caps=StageTokenCaps(plan=40, research=24, review=24, answer=40), context_tokens=8192)


def reflection(question: str, marker: str) -> BankItem:
    return BankItem.new(question=question, rubrics=f"Critical Requirement: {marker} name the language",
                        takeaways=f"1. {marker} search the friar's biography first.", score=0.8, judge_model="judge",
                        policy_version="base", session_id="earlier")


@pytest.fixture
def bank(tmp_path: Path) -> RubricBank:
    return RubricBank(StoreConfig(data_dir=tmp_path / "bank"))


def run(policy: object, tools: dict, bank: RubricBank | None, question: str, tmp_path: Path,  # type: ignore[type-arg]
        options: RunOptions = OPTIONS) -> tuple[object, SessionLog, list[ev.Event]]:
    log = SessionLog(tmp_path / "s.sqlite3")
    events: list[ev.Event] = []
    svc = ResearchService(policy, tools, log, AgentConfig(), bank)  # type: ignore[arg-type]
    return asyncio.run(svc.run(question, options, events.append)), log, events


def test_embedded_run_on_a_question_asked_before_gets_the_within_episode_block(
    embedded_policy: object, local_tools: dict, bank: RubricBank, tmp_path: Path  # type: ignore[type-arg]
) -> None:
    earlier = reflection(QUESTION, "WITHIN-MARK")
    bank.put(earlier)
    out, log, events = run(embedded_policy, local_tools, bank, QUESTION, tmp_path)
    rec = log.get(out.session_id)  # type: ignore[attr-defined]
    prompt = rec.trajectory.prompt.text
    assert "<reference_examples>" in prompt and "## Your Previous Attempt on This Question:" in prompt
    assert "WITHIN-MARK name the language" in prompt and "WITHIN-MARK search the friar" in prompt
    # The block sits in the user message before the question.
    assert prompt.index("</reference_examples>") < prompt.rindex(QUESTION)
    assert rec.status == "completed" and rec.trajectory.injected_bank_items == (earlier.id,)
    assert rec.metrics["bank"] == {"mode": "within", "items": [{"id": earlier.id, "similarity": 1.0}]}
    injected = [e for e in events if isinstance(e, ev.ReferencesInjected)]
    assert injected and injected[0].mode == "within" and injected[0].items[0].item_id == earlier.id


def test_a_similar_question_gets_cross_episode_items_and_injection_can_be_switched_off(
    local_tools: dict, bank: RubricBank, tmp_path: Path  # type: ignore[type-arg]
) -> None:
    a, b = reflection(QUESTION, "CROSS-A"), reflection("Who was Haymo of Faversham?", "CROSS-B")
    bank.put(a)
    bank.put(b)
    bank.put(reflection("What is the boiling point of water at sea level?", "UNRELATED"))
    out, log, events = run(ScriptedPolicy(well_formed()), local_tools, bank, SIMILAR, tmp_path)
    rec = log.get(out.session_id)  # type: ignore[attr-defined]
    prompt = rec.trajectory.prompt.text
    assert "## Similar Question 1:" in prompt and "do not copy them word for word" in prompt
    assert "UNRELATED" not in prompt and "## Your Previous Attempt" not in prompt
    assert set(rec.trajectory.injected_bank_items) <= {a.id, b.id} and rec.trajectory.injected_bank_items
    assert rec.metrics["bank"]["mode"] == "cross"

    off, log2, _ = run(ScriptedPolicy(well_formed()), local_tools, bank, SIMILAR, tmp_path / "off",
                       OPTIONS.model_copy(update={"inject_bank": False}))
    rec2 = log2.get(off.session_id)  # type: ignore[attr-defined]
    assert "<reference_examples>" not in rec2.trajectory.prompt.text and rec2.trajectory.injected_bank_items == ()
    assert rec2.metrics["bank"] == {"mode": "none", "items": []}
    # Different prompt templates → a different prompt hash on the turns.
    assert rec.trajectory.turns[0].prompt_sha != rec2.trajectory.turns[0].prompt_sha


def test_a_broken_bank_never_fails_the_run(local_tools: dict, bank: RubricBank, tmp_path: Path) -> None:  # type: ignore[type-arg]
    import chromadb

    bank.put(reflection(QUESTION, "GONE"))
    chromadb.PersistentClient(path=str(tmp_path / "bank" / "chroma")).delete_collection("rubric_bank")
    out, log, events = run(ScriptedPolicy(well_formed()), local_tools, bank, QUESTION, tmp_path)
    rec = log.get(out.session_id)  # type: ignore[attr-defined]
    assert rec.status == "completed" and rec.trajectory.injected_bank_items == ()
    notes = [e for e in events if isinstance(e, ev.Note) and e.kind == "bank_unavailable"]
    # The chat note carries an error reference; the exception text goes to the log under it (issue 65).
    assert notes and notes[0].data["error"] == (f"error reference {notes[0].data['reference']}; the details are in "
                                                "the app's log")
