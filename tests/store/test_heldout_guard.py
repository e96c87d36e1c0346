"""Issue 62: nothing derived from a held-out question enters the rubric bank or comes out of it, by any path: `put`,
a bulk add, a bank import, an item quoting a held-out question, an item already stored by a bank without the guard,
the app's own bank, and the reflection writer (before anything is sampled). Real embedded Chroma, the shipped
held-out questions."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import asdict
from pathlib import Path

import pytest

from learning.eval.heldout import heldout_guard, load_heldout
from learning.judge.offline_reflection import OfflineReflectionJudge
from learning.reflection import NotReflectable, write_reflection
from store.config import StoreConfig
from store.heldout import HeldoutGuard, HeldOutItemError
from store.records import BankItem
from store.rubric_bank import RubricBank
from store.session_log import SessionLog
from tests.fakes import ScriptedPolicy
from tests.judge.builders import QUESTION

HELD = load_heldout()


def item(question: str, takeaways: str = "1. Search the person's name first.") -> BankItem:
    return BankItem.new(question=question, rubrics="Critical Requirement: name the place", takeaways=takeaways,
                        score=0.7, judge_model="judge-x", policy_version="policy@0", session_id="s-1")


def guarded(path: Path) -> RubricBank:
    return RubricBank(StoreConfig(data_dir=path), heldout=heldout_guard())


def test_the_shipped_guard_knows_every_held_out_question_and_matches_them_respelled() -> None:
    guard = heldout_guard()
    assert len(guard.index) == len(HELD) == 40
    h = HELD[5]
    assert guard.question_id(f"  {h.question.upper()}  ") == h.id
    assert guard.question_id("Who wrote the novel Dracula?") is None
    assert guard.item_id(item("Some other question?", takeaways=f"- Compare: {h.question}")) == h.id
    assert guard.item_id(item(f"In short: {h.question}")) == h.id  # a question that contains one is derived


def test_put_add_many_and_import_refuse_a_held_out_item_naming_its_id(tmp_path: Path) -> None:
    bank = guarded(tmp_path / "data")
    h = HELD[0]
    with pytest.raises(HeldOutItemError, match=h.id):
        bank.put(item(h.question.lower()))
    quoting = item("An ordinary training question?", takeaways=f"The answer to '{HELD[1].question}' was found.")
    with pytest.raises(HeldOutItemError, match=HELD[1].id):
        bank.put(quoting)
    fine = item("Who wrote the novel Dracula?")
    with pytest.raises(HeldOutItemError, match=rf"item 2 of 2 .*{HELD[2].id}"):
        bank.add_many([fine, item(HELD[2].question)])
    assert bank.count() == 0  # the whole batch is refused before anything is written

    export = tmp_path / "bank.jsonl"
    export.write_text("".join(json.dumps(asdict(i)) + "\n" for i in (fine, item(HELD[3].question))))
    with pytest.raises(HeldOutItemError, match=HELD[3].id):
        bank.import_jsonl(export)
    assert bank.count() == 0
    assert bank.put(fine).stored and bank.count() == 1  # an ordinary item still goes in


def test_an_item_stored_without_the_guard_is_never_retrieved(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                                           ) -> None:
    plain = RubricBank(StoreConfig(data_dir=tmp_path / "data"))  # a bank written before the guard existed
    h = HELD[6]
    leaked = item(h.question)
    near = item("Who wrote the novel Dracula?")  # an ordinary question: still retrieved
    assert plain.put(leaked).stored and plain.put(near).stored
    assert leaked.id in plain.retrieve(h.question + " again", mode="cross", min_similarity=-1.0, k=2).item_ids

    bank = guarded(tmp_path / "data")
    with caplog.at_level(logging.WARNING, logger="store.rubric_bank"):
        cross = bank.retrieve(h.question + " again", mode="cross", min_similarity=-1.0, k=2)
        within = bank.retrieve(h.question, mode="within")
    assert leaked.id not in cross.item_ids and near.id in cross.item_ids
    assert within.mode == "none"
    assert f"{leaked.id} is derived from held-out question {h.id}" in caplog.text


def test_the_apps_bank_is_guarded(tmp_path: Path) -> None:
    from app.container import open_bank
    from app.settings import Settings

    bank = open_bank(Settings(store=StoreConfig(data_dir=tmp_path / "data")))
    with pytest.raises(HeldOutItemError, match=HELD[7].id):
        bank.put(item(HELD[7].question))


def test_the_reflection_writer_refuses_a_held_out_session_before_sampling(tmp_path: Path) -> None:
    from tests.reflection.helpers import add_session

    h = HELD[4]
    policy = ScriptedPolicy(lambda _c, _s: "never asked", version="policy@3")
    with SessionLog(tmp_path / "log.sqlite3") as log:
        sid = add_session(log, "s-held", question=h.question)
        bank = guarded(tmp_path / "data")
        with pytest.raises(NotReflectable, match=h.id):
            asyncio.run(write_reflection(sid, log=log, policy=policy, judge=OfflineReflectionJudge(), bank=bank))
        assert policy.calls == [] and log.reflection_candidates(session_id=sid) == [] and bank.count() == 0
        # the guard given is the one used: one over the demo question refuses that session too
        other = HeldoutGuard.of([("x:1", QUESTION)])
        with pytest.raises(NotReflectable, match="x:1"):
            asyncio.run(write_reflection(add_session(log, "s-demo"), log=log, policy=policy,
                                         judge=OfflineReflectionJudge(), bank=bank, heldout=other))


def test_a_guarded_bank_of_one_actor_answers_as_many_hits_as_an_unguarded_one(tmp_path: Path) -> None:
    """Leaving held-out items out must not bring in the shared bank's privacy rule (a bank short of hits answers
    one fewer): a training run's bank of two items still gives both."""
    plain = RubricBank(StoreConfig(data_dir=tmp_path / "data"))
    a, b = item("Who wrote the novel Dracula?"), item("Which author wrote Frankenstein?")
    assert plain.put(a).stored and plain.put(b).stored
    ask = "Who wrote Carmilla and other gothic novels?"
    want = plain.retrieve(ask, mode="cross", min_similarity=-1.0, k=2).item_ids
    assert len(want) == 2
    assert guarded(tmp_path / "data").retrieve(ask, mode="cross", min_similarity=-1.0, k=2).item_ids == want
