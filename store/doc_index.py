"""The local document index behind `local_search`: a Chroma collection plus BM25 over the same chunks, fused.

Dense retrieval (offline MiniLM, cosine) finds paraphrases; BM25 (rank-bm25) finds rare names and numbers that a
small embedding model blurs. The two rankings are merged by reciprocal-rank fusion. Chroma is the only storage: the
BM25 side is rebuilt from Chroma's stored documents when the collection's revision changes, and cached in memory.
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import numpy as np
from chromadb.api import ClientAPI
from chromadb.api.models.Collection import Collection
from rank_bm25 import BM25Okapi

from store.chroma import chroma_errors, open_chroma_client, open_collection, read_unless_empty
from store.config import StoreConfig
from store.embeddings import SentenceTransformerEmbedding, embed_texts
from store.errors import StoreError

RRF_K = 60
"""Reciprocal-rank-fusion constant: score(d) = sum over rankings of 1 / (RRF_K + rank(d)), rank from 1.

60 is the value of Cormack, Clarke and Buettcher (SIGIR 2009), the usual default: it flattens the head of each
ranking so that a passage ranked well by both retrievers beats one ranked first by only one of them.
"""

CANDIDATES_PER_K = 4  # each retriever contributes max(4k, MIN_CANDIDATES) candidates to the fusion
MIN_CANDIDATES = 20
WRITE_BATCH = 256  # chunks embedded and written per step; also the progress granularity

ProgressFn = Callable[[int, int], None]
"""progress(done, total): called after each batch of chunks is embedded and written."""

# Word characters without the underscore: a small model sometimes writes its query as one snake_case identifier
# ('haymo_of_faversham'), which `\w+` would keep as a single token that matches no passage.
_TOKEN = re.compile(r"[^\W_]+", re.UNICODE)
_META_MODEL = "embedding_model"
_META_REVISION = "revision"


class DocIndexError(StoreError):
    """The document index could not be opened, read or written (Chroma down, model mismatch, bad name)."""


@dataclass(frozen=True, slots=True)
class Document:
    """One chunk to index. (source, chunk) identifies it: adding the same pair again replaces it."""

    source: str  # where it came from: an absolute file path, or e.g. "demo:musique_train_corpus.json"
    chunk: int  # position of this chunk within its source, from 0
    text: str
    title: str = ""
    url: str = ""
    doc_id: str = ""  # an id the input carried (jsonl "id"), kept for reference

    @property
    def id(self) -> str:
        """Stable chunk id: a hash of source and chunk index."""
        return chunk_id(self.source, self.chunk)


@dataclass(frozen=True, slots=True)
class Hit:
    """One search result with its fused score and the rank each retriever gave it (None: not retrieved)."""

    id: str
    title: str
    text: str
    source: str
    url: str
    score: float
    dense_rank: int | None = None
    bm25_rank: int | None = None


@dataclass(frozen=True, slots=True)
class _Bm25Cache:
    revision: str
    ids: tuple[str, ...]
    documents: tuple[str, ...]
    metadatas: tuple[Mapping[str, Any], ...]
    position: Mapping[str, int]  # id -> index into the tuples above
    model: BM25Okapi | None  # None for an empty collection (BM25Okapi cannot be built over nothing)


class _LuceneBM25(BM25Okapi):  # type: ignore[misc]  # rank-bm25 ships no type hints
    """BM25Okapi with Lucene's idf, log(1 + (N - n + 0.5) / (n + 0.5)), which is always positive.

    rank-bm25's Robertson idf is zero for a term in half the documents and negative beyond (then floored to a
    constant), so on a small index an exact rare-name match can score nothing at all.
    """

    def _calc_idf(self, nd: dict[str, int]) -> None:
        for word, freq in nd.items():
            self.idf[word] = math.log(1.0 + (self.corpus_size - freq + 0.5) / (freq + 0.5))


def reciprocal_rank_fusion(rankings: Sequence[Sequence[str]], k: int = RRF_K) -> dict[str, float]:
    """Fused scores sum(1 / (k + rank)) over rankings (rank from 1), best first; ties broken by id."""
    fused: dict[str, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            fused[item] = fused.get(item, 0.0) + 1.0 / (k + rank)
    return dict(sorted(fused.items(), key=lambda kv: (-kv[1], kv[0])))


def chunk_id(source: str, chunk: int) -> str:
    """Stable id of chunk `chunk` of `source` (32 hex characters of SHA-256)."""
    return hashlib.sha256(f"{source}\n{chunk}".encode()).hexdigest()[:32]


def tokenize(text: str) -> list[str]:
    """BM25 tokens: lower-cased runs of letters and digits (Unicode-aware, so accented names survive; `_` splits)."""
    return _TOKEN.findall(text.lower())


def normalise_query(query: str) -> str:
    """The query as searched: `_` read as a space, and a phrase of 1-4 words written three or more times back to back
    kept once.

    A small sampled model sometimes writes 'books_being_translated_being_translated_being_translated': searched
    verbatim, the loop outweighs the question's own words in both rankings. Two in a row stay ('Bora Bora',
    'Walla Walla' are names); a loop repeats more.
    """
    out: list[str] = []
    for word in query.replace("_", " ").split():
        out.append(word)
        low = [w.lower() for w in out[-12:]]
        for n in range(1, 5):
            if len(low) >= 3 * n and low[-n:] == low[-2 * n:-n] == low[-3 * n:-2 * n]:
                del out[-2 * n:]
                break
    return " ".join(out)


def search_text(title: str, text: str) -> str:
    """What is embedded and BM25-indexed for a chunk: its title line, then its text."""
    return f"{title}\n{text}" if title else text


def open_index_client(config: StoreConfig) -> ClientAPI:
    """A Chroma client for the document index (DocIndexError when Chroma cannot be opened)."""
    return open_chroma_client(config, DocIndexError)


def _chroma_errors(action: str) -> AbstractContextManager[None]:
    """Map Chroma, transport and model failures to DocIndexError."""
    return chroma_errors(action, DocIndexError)


class DocIndex:
    """Hybrid (dense + BM25) index over document chunks, persisted in a Chroma collection."""

    def __init__(self, config: StoreConfig, client: ClientAPI | None = None, write_batch: int = WRITE_BATCH) -> None:
        """Open (or create) the collection `config.docs_collection`.

        Args:
            config: store settings (Chroma mode and location, collection name, embedding model).
            client: an existing Chroma client to share (Chroma allows one client per path and settings).
            write_batch: chunks embedded and written per step.

        Raises:
            DocIndexError: Chroma is unreachable, the name is invalid, or the collection was built with another
                embedding model.
        """
        self._config = config
        self._model = config.embedding_model
        self._write_batch = max(1, write_batch)
        self._lock = threading.RLock()
        self._bm25: _Bm25Cache | None = None
        self._client = client if client is not None else open_index_client(config)
        self._collection = self._open_collection()

    def _open_collection(self) -> Collection:
        name = self._config.docs_collection
        model_key = self._model_key()
        col, built_with = open_collection(self._client, name, model_key, DocIndexError, "collection",
                                          {_META_REVISION: uuid.uuid4().hex})
        if built_with is not None and built_with != model_key:
            # Vectors from two models are not comparable; refuse rather than return nonsense rankings.
            raise DocIndexError(
                f"collection {name!r} was built with embedding model {built_with!r} but {model_key!r} is "
                "configured; use the same model or another docs_collection"
            )
        return col

    def _model_key(self) -> str:
        # The bundled model is recorded as "" (not its path), so moving the venv does not look like a model change.
        return self._model.strip()

    # ---- reading -------------------------------------------------------------------------------------------

    def count(self) -> int:
        """Number of chunks in the index."""
        with _chroma_errors("count the index"):
            return self._collection.count()

    def has_source(self, source: str) -> bool:
        """Whether any chunk of `source` is indexed."""
        with _chroma_errors("read the index"):
            got = self._collection.get(where={"source": source}, limit=1, include=[])
        return bool(got["ids"])

    def _count(self) -> int:
        with _chroma_errors("count the index"):
            return self._collection.count()

    def source_count(self, source: str) -> int:
        """Number of indexed chunks of `source`."""
        with _chroma_errors("read the index"):
            return len(self._collection.get(where={"source": source}, include=[])["ids"])

    def sources(self) -> set[str]:
        """All sources with at least one indexed chunk."""
        return {str(m.get("source", "")) for m in self._bm25_cache().metadatas}

    def search(self, query: str, k: int) -> list[Hit]:
        """The `k` best chunks for `query` by reciprocal-rank fusion of dense and BM25 rankings.

        A blank query or an empty index gives no hits.

        Raises:
            DocIndexError: Chroma or the embedding model failed.
        """
        query = normalise_query(query)
        if not query or k <= 0:
            return []
        cache = self._bm25_cache()
        n = len(cache.ids)
        if n == 0:
            return []
        depth = min(n, max(k * CANDIDATES_PER_K, MIN_CANDIDATES))
        with _chroma_errors("embed the query"):
            vector = embed_texts([query], self._model)

        def query_dense() -> Any:
            with _chroma_errors("search the index"):
                return self._collection.query(
                    query_embeddings=vector,  # type: ignore[arg-type]
                    n_results=depth,
                    include=["documents", "metadatas"],
                )

        no_hits: Any = {"ids": [[]], "documents": [[]], "metadatas": [[]]}
        dense = read_unless_empty(query_dense, self._count, no_hits)
        dense_ids = list(dense["ids"][0])
        bm25_ids = self._bm25_ranking(cache, query, depth)

        fused = reciprocal_rank_fusion([dense_ids, bm25_ids])
        best = list(fused)[:k]

        records: dict[str, tuple[str, Mapping[str, Any]]] = {}
        docs0 = dense["documents"][0] if dense["documents"] else []
        metas0 = dense["metadatas"][0] if dense["metadatas"] else []
        for cid, doc, meta in zip(dense_ids, docs0, metas0, strict=True):
            records[cid] = (doc or "", meta or {})
        for cid in bm25_ids:
            i = cache.position[cid]
            records.setdefault(cid, (cache.documents[i], cache.metadatas[i]))
        dense_rank = {cid: r for r, cid in enumerate(dense_ids, start=1)}
        bm25_rank = {cid: r for r, cid in enumerate(bm25_ids, start=1)}
        hits = []
        for cid in best:
            doc, meta = records[cid]
            hits.append(
                Hit(
                    id=cid,
                    title=str(meta.get("title", "")),
                    text=doc,
                    source=str(meta.get("source", "")),
                    url=str(meta.get("url", "")),
                    score=fused[cid],
                    dense_rank=dense_rank.get(cid),
                    bm25_rank=bm25_rank.get(cid),
                )
            )
        return hits

    def _bm25_ranking(self, cache: _Bm25Cache, query: str, depth: int) -> list[str]:
        tokens = tokenize(query)
        if cache.model is None or not tokens:
            return []
        scores = cache.model.get_scores(tokens)  # (n,)
        order = scores.argsort()[::-1][:depth]
        # Chunks sharing no term with the query score 0 (or below, for very common terms): not a BM25 match.
        return [cache.ids[i] for i in order if scores[i] > 0]

    def _revision(self) -> str:
        with _chroma_errors("read the index"):
            meta = self._client.get_collection(
                self._config.docs_collection,
                embedding_function=SentenceTransformerEmbedding(self._model),  # type: ignore[arg-type]
            ).metadata
        return str((meta or {}).get(_META_REVISION, ""))

    def _bm25_cache(self) -> _Bm25Cache:
        """BM25 over every stored chunk, rebuilt only when the collection's revision changed (any process)."""
        revision = self._revision()
        with self._lock:
            if self._bm25 is not None and self._bm25.revision == revision:
                return self._bm25
            ids: list[str] = []
            docs: list[str] = []
            metas: list[Mapping[str, Any]] = []
            with _chroma_errors("read the index"):
                total = self._collection.count()
                page = max(1, self._client.get_max_batch_size())
                for offset in range(0, total, page):
                    got = self._collection.get(include=["documents", "metadatas"], limit=page, offset=offset)
                    ids.extend(got["ids"])
                    docs.extend(d or "" for d in got["documents"] or [])
                    metas.extend(m or {} for m in got["metadatas"] or [])
            corpus = [tokenize(search_text(str(m.get("title", "")), d)) for d, m in zip(docs, metas, strict=True)]
            model = _LuceneBM25(corpus) if corpus else None
            position = {cid: i for i, cid in enumerate(ids)}
            self._bm25 = _Bm25Cache(revision, tuple(ids), tuple(docs), tuple(metas), position, model)
            return self._bm25

    # ---- writing -------------------------------------------------------------------------------------------

    @property
    def embedding_model(self) -> str:
        """The configured embedding model ("" = the bundled MiniLM)."""
        return self._model_key()

    def add_documents(
        self,
        docs: Sequence[Document],
        progress: ProgressFn | None = None,
        embeddings: Sequence[Sequence[float]] | None = None,
    ) -> int:
        """Index chunks, replacing every earlier chunk of the same sources. Returns the number of chunks written.

        Each source is replaced as a unit: if anything fails (or `progress` raises) while a source is being
        written, that source is restored to exactly what it was before, and the error propagates. Sources
        finished earlier in the same call stay written.

        Args:
            docs: the chunks.
            progress: called as progress(done, total) after each batch.
            embeddings: precomputed vectors, one per doc in the same order, made with this index's embedding
                model from `search_text(title, text)`; None embeds here.

        Raises:
            ValueError: a chunk is empty, (source, chunk) repeats, or `embeddings` does not match `docs`.
            DocIndexError: Chroma or the embedding model failed (the failing source was rolled back).
        """
        if embeddings is not None and len(embeddings) != len(docs):
            raise ValueError(f"{len(embeddings)} embeddings for {len(docs)} documents")
        by_source = _group_by_source(docs, embeddings)
        total = len(docs)
        done = 0
        with self._lock:
            for source, pairs in by_source.items():
                done = self._replace_source(source, pairs, done, total, progress)
        return total

    def _replace_source(
        self,
        source: str,
        pairs: list[tuple[Document, Sequence[float] | None]],
        done: int,
        total: int,
        progress: ProgressFn | None,
    ) -> int:
        def read_before() -> Any:
            with _chroma_errors(f"read the index for {source!r}"):
                return self._collection.get(where={"source": source},
                                            include=["embeddings", "documents", "metadatas"])

        nothing: Any = {"ids": [], "embeddings": [], "documents": [], "metadatas": []}
        before = read_unless_empty(read_before, self._count, nothing)
        new_ids = [c.id for c, _ in pairs]
        # Batches of similar length waste less padding in the encoder (order within a source does not matter).
        ordered = sorted(pairs, key=lambda p: len(p[0].title) + len(p[0].text))
        try:
            with _chroma_errors(f"index {source!r}"):
                for start in range(0, len(ordered), self._write_batch):
                    batch = [c for c, _ in ordered[start : start + self._write_batch]]
                    given = [v for _, v in ordered[start : start + self._write_batch]]
                    if all(v is not None for v in given):
                        vectors: Any = [np.asarray(v, dtype=np.float32) for v in given]
                    else:
                        vectors = embed_texts([search_text(c.title, c.text) for c in batch], self._model)
                    self._collection.upsert(
                        ids=[c.id for c in batch],
                        embeddings=vectors,
                        documents=[c.text for c in batch],
                        metadatas=[_metadata(c) for c in batch],
                    )
                    done += len(batch)
                    if progress is not None:
                        progress(done, total)
                stale = sorted(set(before["ids"]) - set(new_ids))
                if stale:
                    self._collection.delete(ids=stale)
        except BaseException:
            # Any interruption (even KeyboardInterrupt from a progress bar) must not leave half a source behind.
            self._restore(before, new_ids)
            raise
        self._bump_revision()
        return done

    def _restore(self, before: Mapping[str, Any], new_ids: list[str]) -> None:
        """Put a source back exactly as `before` (a Chroma `get` result), removing chunks added since."""
        with _chroma_errors("roll back a failed write"):
            added = sorted(set(new_ids) - set(before["ids"]))
            if added:
                self._collection.delete(ids=added)
            old_ids = list(before["ids"])
            for start in range(0, len(old_ids), self._write_batch):
                end = start + self._write_batch
                self._collection.upsert(
                    ids=old_ids[start:end],
                    embeddings=list(before["embeddings"][start:end]),
                    documents=list(before["documents"][start:end]),
                    metadatas=list(before["metadatas"][start:end]),
                )
            self._bump_revision()

    def delete_source(self, source: str) -> int:
        """Remove every chunk of `source`; returns how many were removed."""
        with self._lock, _chroma_errors(f"delete {source!r}"):
            ids = self._collection.get(where={"source": source}, include=[])["ids"]
            if ids:
                self._collection.delete(ids=list(ids))
                self._bump_revision()
        return len(ids)

    def _bump_revision(self) -> None:
        # A new revision tells every DocIndex (in any process) that its cached BM25 is stale.
        with _chroma_errors("update the index revision"):
            self._collection.modify(metadata={_META_MODEL: self._model_key(), _META_REVISION: uuid.uuid4().hex})


def _metadata(doc: Document) -> dict[str, str | int]:
    return {"source": doc.source, "chunk": doc.chunk, "title": doc.title, "url": doc.url, "doc_id": doc.doc_id}


def _group_by_source(
    docs: Sequence[Document], embeddings: Sequence[Sequence[float]] | None
) -> dict[str, list[tuple[Document, Sequence[float] | None]]]:
    """(chunk, vector or None) by source (first-seen order), after checking chunks are non-empty and not repeated."""
    by_source: dict[str, list[tuple[Document, Sequence[float] | None]]] = {}
    seen: set[tuple[str, int]] = set()
    for i, doc in enumerate(docs):
        if not doc.source:
            raise ValueError("a document has no source")
        if not doc.text.strip():
            raise ValueError(f"chunk {doc.chunk} of {doc.source!r} is empty")
        key = (doc.source, doc.chunk)
        if key in seen:
            raise ValueError(f"chunk {doc.chunk} of {doc.source!r} appears twice")
        if doc.chunk < 0:
            raise ValueError(f"chunk index of {doc.source!r} must be >= 0")
        seen.add(key)
        by_source.setdefault(doc.source, []).append((doc, embeddings[i] if embeddings is not None else None))
    return by_source


__all__ = [
    "RRF_K",
    "DocIndex",
    "DocIndexError",
    "Document",
    "Hit",
    "ProgressFn",
    "chunk_id",
    "open_index_client",
    "reciprocal_rank_fusion",
    "search_text",
    "tokenize",
]
