"""The bank's retrieval (question index read by id, no count, single-query embedder) returns exactly what the plain
Chroma path returns on the same bank: `reference_retrieve` below is the bank's retrieval as it was before the index
(a metadata-filtered `get` for the within-episode match, `count` then a top-k query for cross-episode items, the
question embedded with `SentenceTransformer.encode`). The benchmark (tests/benchmarks/bank_retrieval.py --baseline)
times it against the bank on the same questions."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import chromadb
import numpy as np
import pytest
from chromadb.api.models.Collection import Collection

from store.config import BankConfig, StoreConfig
from store.embeddings import load_model
from store.records import BankHit, BankItem, Retrieval, question_sha
from store.rubric_bank import RubricBank, withhold_question

NOW = datetime(2026, 11, 1, tzinfo=UTC)
SIMILARITY_TOLERANCE = 1e-6

WHO = ["Who wrote", "Who translated", "Who illustrated", "Who first published", "Who adapted for the stage"]
WORKS = ["the novel Dracula", "Frankenstein", "the poem Beowulf", "the Tale of Genji", "Don Quixote", "the Odyssey",
         "the play Hamlet", "the epic of Gilgamesh", "Moby-Dick", "War and Peace"]
FACTS = ["What is the capital city of France?", "How tall is Mount Everest?", "When did the Berlin Wall fall?",
         "Which element has the atomic number 79?", "How do vaccines train the immune system?"]


@functools.lru_cache(maxsize=4096)  # the reference is slow enough without embedding one question many times
def encode_old(question: str, model: str = "") -> np.ndarray:
    """The question embedding as the bank computed it before: `encode` on a one-question batch (read-only)."""
    vector = load_model(model).encode([question], batch_size=64, normalize_embeddings=True, convert_to_numpy=True)[0]
    vector.flags.writeable = False
    return vector


def _as_item(item_id: str, document: str | None, meta: Mapping[str, Any] | None) -> BankItem:
    m = meta or {}
    return BankItem(id=item_id, question=document or "", question_sha=str(m.get("question_sha", "")),
                    rubrics=str(m.get("rubrics", "")), takeaways=str(m.get("takeaways", "")),
                    score=float(m.get("score", 0.0)), judge_model=str(m.get("judge_model", "")),
                    policy_version=str(m.get("policy_version", "")), session_id=str(m.get("session_id", "")),
                    created_at=str(m.get("created_at", "")))


def _created(item: BankItem) -> datetime:
    t = datetime.fromisoformat(item.created_at)
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def reference_retrieve(
    collection: Collection,
    question: str,
    *,
    top_k: int,
    min_similarity: float,
    mode: str = "auto",
    embedding: Sequence[float] | np.ndarray | None = None,
    embed: Callable[[str], np.ndarray] = encode_old,
) -> Retrieval:
    """Bank retrieval the straightforward way, straight on the bank's Chroma collection (the semantics to keep)."""
    sha = question_sha(question)
    if mode in ("auto", "within"):
        got = collection.get(where={"question_sha": sha}, include=["documents", "metadatas"])
        own = sorted((_as_item(i, d, m) for i, d, m in zip(got["ids"], got["documents"] or [], got["metadatas"] or [],
                                                             strict=True)), key=_created, reverse=True)
        if own:
            return Retrieval("within", (BankHit(own[0], 1.0),))
        if mode == "within":
            return Retrieval("none")
    v = np.asarray(embedding if embedding is not None else embed(question), dtype=np.float32).reshape(-1)
    vec = (v / float(np.linalg.norm(v))).tolist()
    n, kept = collection.count(), []
    depth = top_k + 2
    while n and top_k > 0:
        res = collection.query(query_embeddings=[vec], n_results=min(depth, n),
                               include=["documents", "metadatas", "distances"])
        hits = [BankHit(_as_item(i, d, m), 1.0 - float(dist)) for i, d, m, dist in zip(
            res["ids"][0], (res["documents"] or [[]])[0], (res["metadatas"] or [[]])[0], (res["distances"] or [[]])[0],
            strict=True)]
        kept = [h for h in hits if h.item.question_sha != sha]
        if len(kept) >= top_k or depth >= n:
            break
        depth *= 4
    # Another question's text is withheld from cross-episode hits (it may be another person's; issue 18).
    hits = [BankHit(withhold_question(h.item), h.similarity) for h in kept[:top_k] if h.similarity >= min_similarity]
    return Retrieval("cross", tuple(hits)) if hits else Retrieval("none")


def same_retrieval(got: Retrieval, want: Retrieval) -> bool:
    """Same mode, same items in the same order, similarities equal within float tolerance."""
    return (got.mode == want.mode and [h.item for h in got.hits] == [h.item for h in want.hits]
            and all(math.isclose(g.similarity, w.similarity, abs_tol=SIMILARITY_TOLERANCE)
                    for g, w in zip(got.hits, want.hits, strict=True)))


def item(question: str, n: int, *, days_old: float = 0.0) -> BankItem:
    return BankItem.new(question=question, rubrics=f"Critical Requirement: answer part {n}.",
                        takeaways=f"1. Takeaway {n}.", score=0.3 + (n % 7) / 10, judge_model="judge-x",
                        policy_version="policy@0", session_id=f"s-{n}",
                        created_at=(NOW - timedelta(days=days_old, minutes=n)).isoformat())


def stored_questions() -> list[str]:
    return [f"{who} {work}?" for who in WHO for work in WORKS] + FACTS


def queries(bank_questions: Sequence[str]) -> list[str]:
    """Stored questions as asked again (other case and spacing), near misses and new questions."""
    again = [f"  {q.upper()} " for q in bank_questions[::7]] + list(bank_questions[::5])
    near = [q.replace("Who", "Which author") for q in bank_questions[:12:3]] + ["Who wrote the novel Dracula ?"]
    new = ["Who wrote Carmilla and other gothic novels?", "Who translated the Iliad into English verse?",
           "What is the boiling point of water at sea level?", "Which rivers flow through Paris?",
           "Who composed the opera Carmen?", "How deep is the Mariana Trench?"]
    return again + near + new


def assert_equivalent(bank: RubricBank, collection: Collection, questions: Sequence[str]) -> dict[str, int]:
    """Every question in every mode, with and without a given embedding, with a few k and thresholds."""
    modes = {"within": 0, "cross": 0, "none": 0}
    cfg = bank.config
    for n, q in enumerate(questions):
        given = encode_old(q) if n % 2 else None
        for mode in ("auto", "within", "cross"):
            for k, threshold in ((None, None), (1, -1.0), (5, 0.3)):
                got = bank.retrieve(q, mode=mode, k=k, min_similarity=threshold, embedding=given)  # type: ignore[arg-type]
                want = reference_retrieve(collection, q, mode=mode, embedding=given,
                                          top_k=cfg.top_k if k is None else k,
                                          min_similarity=cfg.min_similarity if threshold is None else threshold)
                assert same_retrieval(got, want), (q, mode, k, threshold, got, want)
                if mode == "auto" and k is None:
                    modes[got.mode] += 1
    return modes


def chroma_collection(data: Path, name: str = "rubric_bank") -> Collection:
    """The bank's collection opened with a client of its own (Chroma's API, not the bank's)."""
    return chromadb.PersistentClient(path=str(data / "chroma")).get_collection(name)


def make_bank(data: Path, **bank: Any) -> RubricBank:
    return RubricBank(StoreConfig(data_dir=data, bank=BankConfig(**bank)), clock=lambda: NOW)


def test_retrieval_matches_the_plain_chroma_path_after_bulk_loads_overwrites_deletes_and_evictions(
    tmp_path: Path,
) -> None:
    bank = make_bank(tmp_path, capacity=54)
    questions = stored_questions()  # 55 questions: one is evicted below
    bank.add_many([item(q, n, days_old=2 + n / 10) for n, q in enumerate(questions)])
    # Overwrites through put: the same question (another wording of its hash), then a near-identical question.
    assert bank.put(item("who wrote THE NOVEL dracula?", 100)).replaced
    assert bank.put(item("Who translated the Tale of Genji ?", 101)).replaced
    bank.delete(bank.by_question("Who illustrated Moby-Dick?").id)  # type: ignore[union-attr]
    # A bulk load that replaces older items of the same questions and skips one older than what is stored.
    result = bank.add_many([item("Who wrote Frankenstein?", 102), item("What is the capital city of France?", 103,
                                                                      days_old=30)])
    assert (result.stored, result.skipped) == (1, 1)
    assert bank.count() <= 54

    modes = assert_equivalent(bank, chroma_collection(tmp_path), queries(questions))
    assert modes["within"] and modes["cross"] and modes["none"]  # the query set exercises every outcome


def test_a_bank_written_before_the_question_index_is_indexed_when_opened(tmp_path: Path) -> None:
    """Items written straight into the collection, as the bank stored them before it kept a question index."""
    bank = make_bank(tmp_path)
    bank.put(item("Who painted the Mona Lisa?", 0))  # creates the collection the way the bank does
    collection = chroma_collection(tmp_path)
    questions = stored_questions()
    old = [item(q, n + 1) for n, q in enumerate(questions)]
    vectors = [encode_old(it.question).tolist() for it in old]
    collection.add(ids=[it.id for it in old], documents=[it.question for it in old], embeddings=vectors,
                   metadatas=[{"question_sha": it.question_sha, "rubrics": it.rubrics, "takeaways": it.takeaways,
                               "score": it.score, "judge_model": it.judge_model,
                               "policy_version": it.policy_version, "session_id": it.session_id,
                               "created_at": it.created_at, "created_ts": _created(it).timestamp()}
                              for it in old])
    client = chromadb.PersistentClient(path=str(tmp_path / "chroma"))
    client.delete_collection("rubric_bank.questions")  # the index did not exist yet

    reopened = make_bank(tmp_path)
    assert reopened.by_question(questions[3]) == old[3]
    assert_equivalent(reopened, collection, queries(questions))


def test_items_removed_behind_the_banks_back_are_never_returned(tmp_path: Path) -> None:
    """A crash between deleting an item and updating the index leaves an indexed id without an item: readers skip
    it. A bank collection deleted and created again starts a new index."""
    bank = make_bank(tmp_path)
    questions = stored_questions()[:20]
    bank.add_many([item(q, n) for n, q in enumerate(questions)])
    collection = chroma_collection(tmp_path)
    gone = bank.by_question(questions[4])
    collection.delete(ids=[gone.id])  # type: ignore[union-attr]
    assert bank.by_question(questions[4]) is None
    assert_equivalent(bank, collection, queries(questions))

    chromadb.PersistentClient(path=str(tmp_path / "chroma")).delete_collection("rubric_bank")
    fresh = make_bank(tmp_path)
    assert fresh.count() == 0 and fresh.retrieve(questions[0]).mode == "none"
    fresh.put(item(questions[0], 0))
    assert fresh.retrieve(questions[0]).mode == "within"
    assert_equivalent(fresh, chroma_collection(tmp_path), queries(questions))


@pytest.mark.parametrize("question", ["Who wrote the novel Dracula?", "  who wrote the NOVEL dracula? ", "x" * 600])
def test_the_query_embedding_is_the_one_encode_gives(tmp_path: Path, question: str) -> None:
    """The single-question embedder and its cache return encode's vector (also for text past the model's length)."""
    bank = make_bank(tmp_path)
    want = encode_old(question)
    assert np.allclose(bank.embed([question])[0], want, atol=1e-7, rtol=0)
    stored = item("Who wrote the novel Dracula?", 0)
    bank.put(stored)
    expected = float(np.dot(want, encode_old(stored.question)))
    for _ in range(2):  # the query embedded, then taken from the cache
        hits = bank.search(question, 1)
        assert [h.item for h in hits] == [stored]
        assert math.isclose(hits[0].similarity, expected, abs_tol=SIMILARITY_TOLERANCE)
