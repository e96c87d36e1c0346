"""DocIndex and local_search on real Chroma (embedded and server) with the real offline MiniLM."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from chromadb.api.shared_system_client import SharedSystemClient
from tools_support import free_port, sample_passages

from agent.errors import SearchError
from agent.ingest import DEMO_SOURCE_PREFIX, ensure_demo_corpus, load_demo_corpus
from agent.tools import LocalSearch
from store.config import StoreConfig
from store.doc_index import RRF_K, DocIndex, DocIndexError, Document, normalise_query, tokenize

# ---- search quality and fusion on 40 real passages ------------------------------------------------------------------


def test_search_finds_passage_by_title_words(passage_index: DocIndex) -> None:
    for doc in sample_passages()[:8]:
        hits = passage_index.search(doc.title, 5)
        assert doc.title in [h.title for h in hits], doc.title


def test_search_by_paraphrase_uses_dense_ranking(passage_index: DocIndex) -> None:
    hits = passage_index.search("monthly peer reviewed periodical about mathematical physics", 3)
    assert hits[0].title == "Journal of Mathematical Physics"
    assert hits[0].dense_rank is not None


def test_fused_score_is_reciprocal_rank_fusion(passage_index: DocIndex) -> None:
    hits = passage_index.search("Jan Philip Solovej University of Copenhagen", 10)
    assert len(hits) == 10
    for hit in hits:
        ranks = [r for r in (hit.dense_rank, hit.bm25_rank) if r is not None]
        assert ranks, "every hit comes from at least one retriever"
        assert hit.score == pytest.approx(sum(1.0 / (RRF_K + r) for r in ranks))
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    top = hits[0]
    assert top.title == "Journal of Mathematical Physics" and top.bm25_rank == 1


def test_snake_case_and_looping_queries_search_their_words(passage_index: DocIndex) -> None:
    """A query written as one snake_case identifier, or looping on a phrase, finds what its words find."""
    for doc in sample_passages()[:4]:
        words = doc.title.split()
        snake = "_".join(words)
        looped = " ".join(words + words[-1:] * 4)
        for query in (snake, looped):
            hits = passage_index.search(query, 5)
            assert doc.title in [h.title for h in hits], (query, doc.title)
            assert any(h.bm25_rank is not None for h in hits if h.title == doc.title), query


def test_normalise_query_by_hand() -> None:
    assert normalise_query("books_being_translated") == "books being translated"
    assert normalise_query("a b a b a b c") == "a b c"
    assert normalise_query("x x x x x y") == "x y"
    assert normalise_query("Bora Bora island") == "Bora Bora island"  # two in a row is a name, not a loop
    assert normalise_query("New York, New Jersey") == "New York, New Jersey"
    assert normalise_query(" _ _ ") == ""
    assert tokenize("haymo_of_faversham Éloïse") == ["haymo", "of", "faversham", "éloïse"]


def test_blank_query_and_zero_k(passage_index: DocIndex) -> None:
    assert passage_index.search("   ", 5) == []
    assert passage_index.search("physics", 0) == []


def test_local_search_tool(passage_index: DocIndex) -> None:
    tool = LocalSearch(passage_index, k=4, snippet_chars=80)
    snippets = asyncio.run(tool("Journal of Mathematical Physics", {}, "1234abcd"))
    assert [s.id for s in snippets] == ["1234abcd-0", "1234abcd-1", "1234abcd-2", "1234abcd-3"]
    assert snippets[0].title == "Journal of Mathematical Physics"
    assert snippets[0].tool == "local_search"
    assert all(len(s.text) <= 80 for s in snippets)
    assert len(asyncio.run(tool("physics", {"limit": "2"}, "1234abce"))) == 2
    with pytest.raises(SearchError, match="empty"):
        asyncio.run(tool("  ", {}, "1234abcf"))
    with pytest.raises(SearchError, match="limit"):
        asyncio.run(tool("physics", {"limit": "1000"}, "1234abd0"))


def test_local_search_on_empty_index(index: DocIndex) -> None:
    assert asyncio.run(LocalSearch(index)("anything", {}, "00000000")) == []


# ---- persistence, staleness, atomicity ---------------------------------------------------------------------------


def docs(source: str, texts: list[str], title: str = "") -> list[Document]:
    return [Document(source=source, chunk=i, text=t, title=title) for i, t in enumerate(texts)]


def test_restart_keeps_documents_and_bm25(store_config: StoreConfig) -> None:
    DocIndex(store_config).add_documents(docs("s", ["The quokka Zorblatt lives on Rottnest Island.", "Cats purr."]))
    SharedSystemClient.clear_system_cache()  # drop Chroma's in-process client: the reopen really reads the disk
    reopened = DocIndex(store_config)
    assert reopened.count() == 2 and reopened.has_source("s")
    [hit, *_] = reopened.search("Zorblatt", 2)
    assert hit.text.startswith("The quokka Zorblatt") and hit.bm25_rank == 1


def test_second_instance_sees_writes_of_the_first(store_config: StoreConfig) -> None:
    a, b = DocIndex(store_config), DocIndex(store_config)
    a.add_documents(docs("s1", ["Alpha passage about Quixotry."]))
    assert b.search("Quixotry", 3)[0].bm25_rank == 1
    a.add_documents(docs("s2", ["Beta passage about Flibbertigibbet."]))
    assert b.search("Flibbertigibbet", 3)[0].bm25_rank == 1  # b's BM25 cache was invalidated by the revision


def test_interrupted_write_rolls_the_source_back(store_config: StoreConfig) -> None:
    index = DocIndex(store_config, write_batch=2)
    index.add_documents(docs("file", ["old one", "old two", "old three"], title="Old"))
    index.add_documents(docs("other", ["untouched"]))
    snapshot = sorted((h.id, h.text) for h in index.search("old", 10))

    class Interrupted(Exception):
        pass

    def interrupt(done: int, total: int) -> None:
        if done >= 2:  # after the first batch of the new version has been written
            raise Interrupted

    new = docs("file", ["new a", "new b", "new c", "new d", "new e"], title="New")
    with pytest.raises(Interrupted):
        index.add_documents(new, progress=interrupt)
    assert index.source_count("file") == 3 and index.count() == 4
    assert sorted((h.id, h.text) for h in index.search("old", 10)) == snapshot
    assert {h.title for h in index.search("new", 10)} <= {"Old", ""}


def test_bad_documents_are_refused_before_writing(index: DocIndex) -> None:
    with pytest.raises(ValueError, match="empty"):
        index.add_documents([*docs("s", ["fine"]), Document(source="s", chunk=1, text="  ")])
    with pytest.raises(ValueError, match="twice"):
        index.add_documents([*docs("s", ["fine"]), Document(source="s", chunk=0, text="again")])
    with pytest.raises(ValueError, match="embeddings"):
        index.add_documents(docs("s", ["fine"]), embeddings=[])
    assert index.count() == 0


def test_delete_source(index: DocIndex) -> None:
    index.add_documents(docs("a", ["one", "two"]) + docs("b", ["three"]))
    assert index.delete_source("a") == 2
    assert index.sources() == {"b"} and index.count() == 1


def test_embedding_model_mismatch_is_refused(store_config: StoreConfig) -> None:
    DocIndex(store_config).add_documents(docs("s", ["text"]))
    other = store_config.model_copy(update={"embedding_model": "/models/some-other-model"})
    with pytest.raises(DocIndexError, match="built with embedding model"):
        DocIndex(other)


def test_invalid_collection_name(store_config: StoreConfig) -> None:
    with pytest.raises(DocIndexError):
        DocIndex(store_config.model_copy(update={"docs_collection": "x"}))


def test_precomputed_embeddings_are_used(index: DocIndex) -> None:
    from store.doc_index import search_text
    from store.embeddings import embed_texts

    batch = docs("pre", ["Wombats produce cube-shaped droppings.", "Lyrebirds mimic chainsaws."])
    vectors = embed_texts([search_text(d.title, d.text) for d in batch])
    assert index.add_documents(batch, embeddings=vectors) == 2
    assert index.search("animal that imitates machine sounds", 1)[0].text == "Lyrebirds mimic chainsaws."


# ---- Chroma server mode -------------------------------------------------------------------------------------------


def test_server_mode(chroma_server: tuple[str, int], embedding_model: object, tmp_path: Path) -> None:
    host, port = chroma_server
    cfg = StoreConfig(data_dir=tmp_path, chroma_mode="server", chroma_host=host, chroma_port=port)
    index = DocIndex(cfg)
    index.add_documents(docs("srv", ["The numbat eats termites.", "Bilbies are desert marsupials."]))
    again = DocIndex(cfg)  # a second client, as another process would have
    assert again.count() == 2 and again.has_source("srv")
    hits = again.search("termite eating animal", 2)
    assert hits[0].text == "The numbat eats termites."
    index.add_documents(docs("srv", ["Only the numbat now."]))
    assert again.source_count("srv") == 1 and again.search("numbat", 5)[0].text == "Only the numbat now."


def test_server_unreachable_is_a_doc_index_error(tmp_path: Path) -> None:
    cfg = StoreConfig(data_dir=tmp_path, chroma_mode="server", chroma_port=free_port())
    with pytest.raises(DocIndexError):
        DocIndex(cfg)


# ---- demo corpus ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_demo_corpus_slice_is_searchable(index: DocIndex) -> None:
    passages = load_demo_corpus(["hotpotqa_train_corpus.json"])[:300]
    index.add_documents(passages)
    target = passages[123]
    hits = index.search(f"{target.title} {target.text[:120]}", 5)
    assert hits[0].title == target.title


def test_shipped_demo_vectors_match_the_bundled_model(embedding_model: object) -> None:
    import numpy as np

    from agent.ingest import DEMO_CORPUS_FILES, DEMO_VECTORS, _demo_documents, _demo_vectors
    from store.doc_index import search_text
    from store.embeddings import embed_texts

    assert DEMO_VECTORS.is_file(), "agent/demo_corpus/minilm_vectors.npz is missing: run build_demo_vectors()"
    shipped = _demo_vectors(list(DEMO_CORPUS_FILES))
    assert shipped is not None and len(shipped) == 9003
    docs = [d for name in DEMO_CORPUS_FILES for d in _demo_documents(name)]
    picks = list(range(0, 9003, 751))  # a dozen passages across all three files
    fresh = embed_texts([search_text(docs[i].title, docs[i].text) for i in picks])
    for i, vec in zip(picks, fresh, strict=True):
        assert float(np.dot(vec, shipped[i])) > 0.999  # float16 rounding only


@pytest.mark.slow
def test_ensure_demo_corpus_indexes_once_and_repairs(index: DocIndex) -> None:
    seen: list[tuple[int, int]] = []
    assert ensure_demo_corpus(index, progress=lambda done, total: seen.append((done, total))) == 9003
    assert index.count() == 9003 and seen[-1] == (9003, 9003)
    assert index.search("Teutberga queen of Lotharingia", 3)[0].title == "Teutberga"
    assert ensure_demo_corpus(index) == 0  # complete: nothing to do
    hotpot = DEMO_SOURCE_PREFIX + "hotpotqa_train_corpus.json"
    index.delete_source(hotpot)  # as if the first run had been killed while writing this file
    assert ensure_demo_corpus(index) == 994
    assert index.source_count(hotpot) == 994 and index.count() == 9003


def test_reciprocal_rank_fusion_by_hand() -> None:
    from store.doc_index import reciprocal_rank_fusion

    fused = reciprocal_rank_fusion([["a", "b", "c"], ["c", "a"]], k=60)
    assert list(fused) == ["a", "c", "b"]  # a: 1/61 + 1/62; c: 1/63 + 1/61; b: 1/62
    assert fused["a"] == pytest.approx(1 / 61 + 1 / 62)
    assert fused["b"] == pytest.approx(1 / 62)
    assert list(reciprocal_rank_fusion([["y"], ["x"]])) == ["x", "y"]  # equal scores: by id
