"""The rubric bank on real Chroma (embedded and `chroma run`) with the bundled MiniLM: retrieval modes, overwrite,
hygiene (dedup, capacity, export/import) and safety (validation, atomic writes, readers beside a writer)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from store.config import BankConfig, StoreConfig
from store.errors import InvalidInput
from store.records import BankItem, question_sha
from store.rubric_bank import WITHHELD_QUESTION, BankError, BankItemNotFound, RubricBank

NOW = datetime(2026, 11, 1, tzinfo=UTC)


def item(question: str, score: float = 0.7, *, days_old: float = 0.0, rubrics: str = "Critical Requirement: name "
         "the translator", takeaways: str = "1. Search the person's name first.") -> BankItem:
    return BankItem.new(question=question, rubrics=rubrics, takeaways=takeaways, score=score, judge_model="judge-x",
                        policy_version="policy@0", session_id="s-1",
                        created_at=(NOW - timedelta(days=days_old)).isoformat())


def make_bank(path: Path, **bank: object) -> RubricBank:
    return RubricBank(StoreConfig(data_dir=path, bank=BankConfig(**bank)), clock=lambda: NOW)  # type: ignore[arg-type]


@pytest.fixture
def bank(tmp_path: Path) -> RubricBank:
    return make_bank(tmp_path / "data")


def test_within_episode_is_an_exact_question_match_and_cross_episode_the_top_k_of_other_questions(
    bank: RubricBank,
) -> None:
    dracula = item("Who wrote the novel Dracula?")
    frankenstein = item("Which author wrote Frankenstein?")
    for it in (dracula, frankenstein, item("What is the capital city of France?"),
               item("Who painted the Mona Lisa?")):
        assert bank.put(it).stored

    within = bank.retrieve("  who wrote the NOVEL dracula? ")  # same question after normalisation
    assert within.mode == "within" and within.item_ids == (dracula.id,) and within.hits[0].similarity == 1.0

    cross = bank.retrieve("Who wrote Carmilla and other gothic novels?")
    assert cross.mode == "cross" and 1 <= len(cross.hits) <= 2  # top-k = 2 by default
    sims = [h.similarity for h in cross.hits]
    assert sims == sorted(sims, reverse=True) and min(sims) >= bank.config.min_similarity
    assert {h.item.id for h in cross.hits} <= {dracula.id, frankenstein.id}
    # Another question's text never travels into a prompt (it may be another person's): rubrics and takeaways only.
    assert {h.item.question for h in cross.hits} == {WITHHELD_QUESTION}
    assert {h.item.rubrics for h in cross.hits} <= {dracula.rubrics, frankenstein.rubrics}

    # Asked explicitly for cross-episode items, a question's own item is never among them.
    own_excluded = bank.retrieve("Who wrote the novel Dracula?", mode="cross", min_similarity=-1.0)
    assert own_excluded.mode == "cross" and dracula.id not in own_excluded.item_ids
    assert bank.retrieve("How do vaccines train the immune system?").mode == "none"  # nothing similar enough
    assert bank.retrieve("A question never asked", mode="within").mode == "none"


def test_a_newer_reflection_replaces_the_older_one_for_the_same_question(bank: RubricBank) -> None:
    old = item("Who wrote the novel Dracula?", 0.9, days_old=2)
    new = item("who wrote the novel   Dracula?", 0.4, takeaways="1. Cite the publisher's page.")
    assert bank.put(old).stored
    result = bank.put(new)
    assert result.stored and result.replaced == (old.id,)
    assert bank.count() == 1 and bank.by_question("Who wrote the novel Dracula?") == new
    with pytest.raises(BankItemNotFound):
        bank.get(old.id)
    # An item older than the stored one is refused (an import cannot roll the bank back).
    stale = bank.put(item("Who wrote the novel Dracula?", days_old=5))
    assert not stale.stored and "newer" in stale.reason and bank.get(new.id) == new


def test_near_identical_questions_are_one_question(bank: RubricBank) -> None:
    first = item("Who wrote the novel Dracula?", days_old=1)
    bank.put(first)
    second = item("Who wrote the novel Dracula ?")  # another hash, the same question
    assert second.question_sha != first.question_sha
    assert bank.put(second).replaced == (first.id,) and bank.count() == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [({"rubrics": "  "}, "rubrics block is empty"), ({"takeaways": ""}, "takeaways block is empty"),
     ({"score": 1.5}, "score"), ({"score": float("nan")}, "score"), ({"question_sha": "0" * 64}, "question_sha"),
     ({"created_at": "yesterday"}, "created_at"), ({"question": ""}, "question is empty")],
)
def test_invalid_items_are_refused_and_nothing_is_written(bank: RubricBank, change: dict, message: str) -> None:  # type: ignore[type-arg]
    from dataclasses import replace

    bank.put(item("What is the capital city of France?"))
    with pytest.raises(InvalidInput, match=message):
        bank.put(replace(item("Who painted the Mona Lisa?"), **change))
    assert bank.count() == 1


def test_capacity_evicts_the_lowest_score_discounted_by_age(tmp_path: Path) -> None:
    bank = make_bank(tmp_path, capacity=3, half_life_days=30.0)
    old_good = item("Who wrote the novel Dracula?", 0.9, days_old=90)  # retention 0.9 / 8 ≈ 0.11
    fresh_weak = item("Which author wrote Frankenstein?", 0.3)  # 0.3
    fresh_good = item("What is the capital city of France?", 0.8)  # 0.8
    for it in (old_good, fresh_weak, fresh_good):
        bank.put(it)
    result = bank.put(item("Who painted the Mona Lisa?", 0.5))
    assert result.evicted == (old_good.id,) and bank.count() == 3
    result = bank.put(item("Who discovered penicillin?", 0.6))
    assert result.evicted == (fresh_weak.id,)


def test_eviction_ranks_every_item_even_when_another_writer_changed_the_bank(tmp_path: Path) -> None:
    """Eviction ranks from memory after its first scan; writes by another process (here a second instance on the
    same store) are still ranked: a changed count, or a chosen victim that is already gone, rebuilds the ranking."""
    a = make_bank(tmp_path, capacity=3)
    b = make_bank(tmp_path, capacity=3)
    q = ["Who wrote the novel Dracula?", "Which author wrote Frankenstein?", "What is the capital city of France?",
         "Who painted the Mona Lisa?", "Who discovered penicillin?", "Which river flows through Cairo?",
         "Who composed the Moonlight Sonata?"]
    s90, s50, s70, s80 = item(q[0], 0.9), item(q[1], 0.5), item(q[2], 0.7), item(q[3], 0.8)
    for it in (s90, s50, s70):
        assert a.put(it).evicted == ()
    assert a.put(s80).evicted == (s50.id,)  # a's first eviction: scans once
    s10 = item(q[4], 0.1)
    assert b.put(s10).evicted == (s10.id,)  # b scans too: the new item is the weakest
    s95 = item(q[5], 0.95)
    assert b.put(s95).evicted == (s70.id,)  # a still counts 3 items, one of them (0.7) gone, 0.95 unseen
    s75 = item(q[6], 0.75)
    # a's memory would pick 0.7 (already gone): it finds it missing, rescans, and evicts the true weakest, 0.75.
    assert a.put(s75).evicted == (s75.id,)
    assert {i.id for i in a.items()} == {s90.id, s80.id, s95.id}


def test_export_then_import_round_trips_and_a_bad_line_writes_nothing(tmp_path: Path, bank: RubricBank) -> None:
    items = [item(q, s, days_old=d) for q, s, d in [("Who wrote the novel Dracula?", 0.5, 3),
                                                     ("Who painted the Mona Lisa?", 0.8, 1)]]
    for it in items:
        bank.put(it)
    path = tmp_path / "out" / "bank.jsonl"
    assert bank.export_jsonl(path) == 2
    other = make_bank(tmp_path / "other")
    result = other.import_jsonl(path)
    assert (result.read, result.stored, result.skipped) == (2, 2, 0)
    assert sorted(other.list_items(), key=lambda i: i.id) == sorted(items, key=lambda i: i.id)
    again = other.import_jsonl(path)  # importing the same export again is idempotent
    assert (again.stored, again.replaced) == (2, 0) and other.count() == 2

    bad = tmp_path / "bad.jsonl"
    good_line = path.read_text().splitlines()[0]
    bad.write_text(good_line + "\n" + '{"question": "no other fields"}\n')
    fresh = make_bank(tmp_path / "fresh")
    with pytest.raises(InvalidInput, match=r"bad.jsonl:2"):
        fresh.import_jsonl(bad)
    assert fresh.count() == 0
    with pytest.raises(InvalidInput, match="cannot read"):
        fresh.import_jsonl(tmp_path / "missing.jsonl")


def test_dedupe_keeps_the_newest_of_near_identical_items(bank: RubricBank) -> None:
    older, newer = item("Who wrote the novel Dracula?", days_old=2), item("who wrote the novel dracula ?")
    other = item("What is the capital city of France?")
    bank.add_many([older, newer, other])  # bulk load: no near-duplicate check per item
    assert bank.count() == 3
    assert bank.dedupe() == [older.id]
    assert {i.id for i in bank.list_items()} == {newer.id, other.id}


def test_bulk_load_with_precomputed_embeddings_keeps_the_newest_per_question(bank: RubricBank) -> None:
    a_old, a_new = item("Question A?", 0.2, days_old=3), item("question a?", 0.6)
    b = item("Question B?")
    vectors = [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    result = bank.add_many([a_new, b, a_old], vectors[:1] + vectors[2:] + vectors[1:2])
    assert (result.stored, result.skipped) == (2, 1)
    assert bank.by_question("Question A?") == a_new
    hit = bank.retrieve("Question C?", mode="cross", embedding=[0.1, 1.0, 0.0])
    assert hit.item_ids[0] == b.id and hit.hits[0].similarity > 0.99
    with pytest.raises(InvalidInput, match="embeddings"):
        bank.add_many([item("Question D?")], [])
    with pytest.raises(InvalidInput, match="non-zero"):
        bank.add_many([item("Question D?")], [[0.0, 0.0, 0.0]])


def test_delete_show_and_model_mismatch(tmp_path: Path, bank: RubricBank) -> None:
    it = item("Who painted the Mona Lisa?")
    bank.put(it)
    assert bank.get(it.id) == it
    bank.delete(it.id)
    with pytest.raises(BankItemNotFound):
        bank.delete(it.id)
    with pytest.raises(BankError, match="built with embedding model"):
        make_bank(tmp_path / "data", embedding_model="Qwen/Qwen3-Embedding-0.6B")


def test_server_mode_serves_a_reader_beside_a_writer(chroma_server: tuple[str, int], tmp_path: Path) -> None:
    host, port = chroma_server
    cfg = StoreConfig(data_dir=tmp_path, chroma_mode="server", chroma_host=host, chroma_port=port,
                      bank=BankConfig(collection="bank_server_test"))
    writer, reader = RubricBank(cfg), RubricBank(cfg)  # two clients, as the trainer and the app would be
    questions = [f"Who founded the city number {i} of the old kingdom?" for i in range(12)]
    errors: list[BaseException] = []
    seen: list[str] = []

    def read() -> None:
        try:
            for _ in range(30):
                r = reader.retrieve(questions[0])
                seen.append(r.mode)
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    t = threading.Thread(target=read)
    t.start()
    for q in questions:
        writer.put(item(q))
    t.join(timeout=120)
    assert not errors and seen
    assert reader.count() == len(questions)
    assert reader.retrieve(questions[3]).item_ids == (writer.by_question(questions[3]).id,)  # type: ignore[union-attr]
    assert question_sha(questions[3]) == reader.by_question(questions[3]).question_sha  # type: ignore[union-attr]


@pytest.mark.parametrize("round_", range(3))
def test_hosts_opening_a_new_bank_on_one_server_together_all_succeed(chroma_server: tuple[str, int], tmp_path: Path,
                                                                     round_: int) -> None:
    """Several hosts (two apps and a scheduler) open a bank that does not exist yet on one Chroma server at the same
    moment: every one opens it, with one question index between them (CI met "Collection … already exists")."""
    host, port = chroma_server
    cfg = StoreConfig(data_dir=tmp_path, chroma_mode="server", chroma_host=host, chroma_port=port,
                      bank=BankConfig(collection=f"bank_race_{round_}_{tmp_path.name[-6:]}"))
    start = threading.Barrier(6)
    banks: list[RubricBank] = []
    errors: list[BaseException] = []

    def open_bank() -> None:
        start.wait()
        try:
            banks.append(RubricBank(cfg))
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=open_bank) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert len(banks) == 6
    banks[0].put(item("Who founded the city by the river?"))
    assert all(b.retrieve("Who founded the city by the river?").mode for b in banks)
    assert banks[5].by_question("Who founded the city by the river?") is not None


def test_an_unreachable_server_is_a_clear_error(tmp_path: Path) -> None:
    from tests.servers import free_port

    cfg = StoreConfig(data_dir=tmp_path, chroma_mode="server", chroma_port=free_port())
    with pytest.raises(BankError, match="could not"):
        RubricBank(cfg)
