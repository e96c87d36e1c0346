"""The rubric bank: accepted reflections in a Chroma collection, embedded by question (RubricEM §3.4, METHOD §7).

Retrieval has two modes. Within-episode: an exact match on the SHA-256 of the normalised question (the user asked
this before). Cross-episode: the top-k items of *other* questions by cosine similarity (normalised embeddings, so
cosine = inner product, METHOD open point 19), at or above a minimum similarity. Only the question is embedded, not
its format instruction.

Write rules (decisions for this project, METHOD open points 16-19):
- one item per question: a newer item replaces an older one with the same question hash, and also any item whose
  question is near-identical (cosine >= `dedup_similarity`), because those are the same question in other words;
  an item older than the one already stored is not written (imports cannot roll the bank back);
- a write is one Chroma record (document, embedding and metadata together), added before the items it replaces are
  deleted: a failure leaves either the old item or both, never a partial one, and readers take the newest;
- beyond `capacity` items, the lowest retention u * 0.5 ** (age_days / half_life_days) are evicted.
One process writes (the trainer); any number read (the app), through a Chroma server when they are separate.

The question index. Chroma answers a lookup by id in about half a millisecond, but any `get` by metadata filter (and
`count`) scans the collection: 10-15 ms at 100,000 items, most of a retrieval's time. So a second Chroma collection,
`<collection>.questions`, maps each question hash (its record id) to the ids of the bank items with that hash: the
within-episode lookup and the write rules read it by id, then read those items by id. It lives in Chroma beside the
bank, so every process and every client sees the same index and no process keeps state that could go stale. Writes
keep it a superset of the truth: an item's id is added to the index before the item is written, and removed only
after the item is deleted; a reader drops ids that no longer exist and items whose hash differs, so a crash between
the two writes changes no result. A bank written before the index existed (or an index left incomplete, or one of a
bank collection since recreated) is indexed in full when the bank is opened (about a minute at 100,000 items, once),
best before the trainer writes: an item written by another process during that build may be left out of it.
Processes that write the bank must all run this version: a writer that does not know the index would leave its
items out of the within-episode lookup.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import json
import logging
import math
import os
import tempfile
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
from chromadb.api import ClientAPI
from chromadb.api.models.Collection import Collection
from chromadb.errors import NotFoundError

from store.chroma import chroma_errors, open_chroma_client, open_collection, read_unless_empty
from store.config import BankConfig, StoreConfig
from store.embeddings import embed_query, embed_texts
from store.errors import InvalidInput, StoreError
from store.heldout import HeldoutGuard, HeldOutItemError
from store.owner import current_actor
from store.records import BankHit, BankItem, Retrieval, question_sha

__all__ = [
    "BankError",
    "BankHit",
    "BankItem",
    "BankItemNotFound",
    "HeldOutItemError",
    "ImportResult",
    "PutResult",
    "Retrieval",
    "RubricBank",
    "question_sha",
]

_META_MODEL = "embedding_model"
_FIELDS = tuple(f.name for f in fields(BankItem))
INDEX_SUFFIX = ".questions"  # the question index collection is named <bank collection><INDEX_SUFFIX>
_INDEX_OF = "question_index_of"  # index metadata: the id of the bank collection it indexes
_INDEX_COMPLETE = "complete"  # index metadata: "yes" once every item of that collection is in it
MAX_TEXT_CHARS = 20_000  # per block; a reflection is a few hundred words

_log = logging.getLogger(__name__)

RequestedMode = Literal["auto", "within", "cross"]


class BankError(StoreError):
    """The bank could not be opened, read or written (Chroma down, model mismatch, bad file)."""


class BankItemNotFound(BankError, LookupError):
    """No bank item has this id."""


@dataclass(frozen=True, slots=True)
class PutResult:
    """What a write did: stored (or why not), the ids it replaced and the ids evicted for capacity."""

    item: BankItem
    stored: bool
    replaced: tuple[str, ...] = ()
    evicted: tuple[str, ...] = ()
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ImportResult:
    """What an import did."""

    read: int
    stored: int
    replaced: int
    skipped: int
    evicted: int


def _parse_time(value: str) -> datetime:
    t = datetime.fromisoformat(value)
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def validate_item(item: BankItem) -> None:
    """Raise InvalidInput unless the item is complete and consistent (non-empty blocks, u in [0, 1], own hash)."""
    if not isinstance(item, BankItem):
        raise InvalidInput(f"expected a BankItem, got {type(item).__name__}")
    for name in _FIELDS:
        if name != "score" and not isinstance(getattr(item, name), str):
            raise InvalidInput(f"bank item field {name!r} must be a string")
    if not item.id.strip():
        raise InvalidInput("bank item id is empty")
    if not item.question.strip():
        raise InvalidInput("bank item question is empty")
    if item.question_sha != question_sha(item.question):
        raise InvalidInput("bank item question_sha does not match its question")
    for name in ("rubrics", "takeaways"):
        text = getattr(item, name)
        if not text.strip():
            raise InvalidInput(f"bank item {name} block is empty")
        if len(text) > MAX_TEXT_CHARS:
            raise InvalidInput(f"bank item {name} block is {len(text):,} characters; the limit is {MAX_TEXT_CHARS:,}")
    if isinstance(item.score, bool) or not isinstance(item.score, int | float) or not 0.0 <= item.score <= 1.0:
        raise InvalidInput(f"bank item score must be a number in [0, 1], got {item.score!r}")
    try:
        _parse_time(item.created_at)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"bank item created_at is not an ISO-8601 time: {item.created_at!r}") from exc


WITHHELD_QUESTION = "(another session's question; not shown)"


HELD_BACK = 1  # a search that must not tell what it left out never answers with the bank's last item (see search)
SIMILARITY_STEP = 0.1  # the grid of similarities wherever another person's question could be behind one
OWN_SESSIONS_PER_QUERY = 5000  # session ids per `$in` filter in `search_own`: ~25 ms for 5,000, 120 ms as 5 x 1,000


def coarse_similarity(similarity: float) -> float:
    """`similarity` rounded down to SIMILARITY_STEP: enough to rank and judge relevance by, too coarse to climb
    towards a hidden question by rewording the query (issue 46)."""
    steps = math.floor(similarity / SIMILARITY_STEP + 1e-9)  # 0.7 / 0.1 is 6.999...: still step 7
    return round(steps * SIMILARITY_STEP, 1)


def withhold_question(item: BankItem) -> BankItem:
    """The item as injected into a prompt for a different question: its rubrics and takeaways only.

    Another question may be another person's, so its text never travels into someone else's prompt; a within-episode
    hit is the asker's own question, so it needs no withholding."""
    return replace(item, question=WITHHELD_QUESTION)


def retention(item: BankItem, now: datetime, half_life_days: float) -> float:
    """Eviction priority: the score halved every `half_life_days` of age (higher is kept)."""
    return decayed_score(item.score, (now - _parse_time(item.created_at)).total_seconds(), half_life_days)


def decayed_score(score: float, age_seconds: float, half_life_days: float) -> float:
    """`score` halved every `half_life_days` of `age_seconds` (a negative age counts as 0)."""
    return score * 0.5 ** (max(0.0, age_seconds / 86400.0) / half_life_days)


def _metadata(item: BankItem) -> dict[str, str | float]:
    meta: dict[str, str | float] = {k: v for k, v in asdict(item).items() if k not in ("id", "question")}
    meta["created_ts"] = _parse_time(item.created_at).timestamp()
    return meta


def _item(item_id: str, document: str | None, meta: Mapping[str, Any] | None) -> BankItem:
    m = meta or {}
    return BankItem(
        id=item_id,
        question=document or "",
        question_sha=str(m.get("question_sha", "")),
        rubrics=str(m.get("rubrics", "")),
        takeaways=str(m.get("takeaways", "")),
        score=float(m.get("score", 0.0)),
        judge_model=str(m.get("judge_model", "")),
        policy_version=str(m.get("policy_version", "")),
        session_id=str(m.get("session_id", "")),
        created_at=str(m.get("created_at", "")),
    )


def _index_vector(sha: str) -> list[float]:
    """A question-index record's vector. The index is only ever read by id, but Chroma stores a vector with every
    record; one derived from the hash keeps the records spread out, so the collection's HNSW graph stays sound."""
    digest = hashlib.sha256(sha.encode()).digest()
    return [int.from_bytes(digest[i:i + 4], "big") / 2**32 - 0.5 for i in range(0, 16, 4)]


def _index_ids(meta: Mapping[str, Any] | None) -> set[str]:
    return set(json.loads(str((meta or {}).get("ids", "[]"))))


def _vector(embedding: Sequence[float] | np.ndarray) -> list[float]:
    v = np.asarray(embedding, dtype=np.float32).reshape(-1)
    norm = float(np.linalg.norm(v))
    if v.size == 0 or not math.isfinite(norm) or norm == 0.0:
        raise InvalidInput("an embedding must be a non-empty, finite, non-zero vector")
    return (v / norm).tolist()  # normalised: cosine similarity = 1 - Chroma's cosine distance


class SessionOwners(Protocol):
    """Who owns which session, and whose items may reach whom (`store.people.SessionOwners` answers from the
    session log)."""

    def owners_of(self, session_ids: Sequence[str]) -> Mapping[str, str]:
        """{session id: owner} for the ids that exist; unknown ids are left out."""
        ...

    def sessions_of(self, owner: str) -> Sequence[str]:
        """Every session `owner` owns."""
        ...

    def unshared_with(self, asker: str, session_ids: Sequence[str]) -> Collection[str]:
        """The sessions among `session_ids` of a team that is not `asker`'s and does not share (issue 65)."""
        ...


class RubricBank:
    """The Chroma-backed rubric bank (embedded PersistentClient or a Chroma server, per settings)."""

    def __init__(
        self,
        config: StoreConfig,
        client: ClientAPI | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        owners: SessionOwners | None = None,
        heldout: HeldoutGuard | None = None,
    ) -> None:
        """Open (or create) the bank collection.

        Args:
            config: store settings; `config.bank` holds the collection, embedding model and retrieval knobs.
            client: an existing Chroma client to share with the document index (one client per path).
            clock: the current time (eviction ages items by it).
            owners: who owns the sessions items were reflected from. Given (the app's shared bank), a same-question
                hit is only ever the asker's own (issue 34): see `retrieve`. None: a bank of one actor, such as a
                training run's own bank, where every item is the run's.
            heldout: the held-out guard (store.heldout; the app always gives one): an item derived from a held-out
                question is refused on every write path (`put`, `add_many`, `import_jsonl`) with its id named, and
                one already stored (written before the guard, or by a process without it) is never retrieved.

        Raises:
            BankError: Chroma cannot be opened, or the collection was built with another embedding model.
        """
        self.config: BankConfig = config.bank
        self._clock = clock
        self._lock = threading.RLock()
        self._retained: dict[str, tuple[float, float, str]] | None = None  # eviction's ranking data (see _evict)
        self._batch: int | None = None
        self._owners = owners
        self._heldout = heldout
        self._client = client if client is not None else open_chroma_client(config, BankError)
        self._collection = self._open_collection()
        self._index = self._open_index()

    def _open_collection(self) -> Collection:
        name, model = self.config.collection, self.config.embedding_model.strip()
        col, built_with = open_collection(self._client, name, model, BankError, "the rubric bank collection")
        if built_with is not None and built_with != model:
            raise BankError(
                f"the rubric bank {name!r} was built with embedding model {built_with!r} but {model!r} is configured; "
                "use the same model, another bank collection, or export and re-import the bank"
            )
        return col

    def _open_index(self) -> Collection:
        """Open the question index, first building it when it is missing, incomplete or of another collection."""
        name, bank_id = self.config.collection + INDEX_SUFFIX, str(self._collection.id)
        meta = {_INDEX_OF: bank_id}
        with chroma_errors(f"open the rubric bank's question index {name!r}", BankError):
            # get_or_create, never get-then-create: several hosts opening one Chroma server's new bank at once would
            # race to create the index and all but one fail with "already exists". Metadata of an existing
            # collection is left as it is.
            index = self._client.get_or_create_collection(name, embedding_function=None, metadata=meta)  # type: ignore[arg-type]
            found = index.metadata or {}
            if found.get(_INDEX_OF) == bank_id and found.get(_INDEX_COMPLETE) == "yes":
                return index
            if found.get(_INDEX_OF) != bank_id:  # the bank collection was recreated: its old index means nothing
                with contextlib.suppress(NotFoundError):  # another host may have dropped it first
                    self._client.delete_collection(name)
                index = self._client.get_or_create_collection(name, embedding_function=None, metadata=meta)  # type: ignore[arg-type]
        self._index = index
        with self._lock:
            pairs = [(m, i) for i, m in self._scan_shas()]
            self._index_update(add=pairs)
        with chroma_errors(f"open the rubric bank's question index {name!r}", BankError):
            index.modify(metadata={**meta, _INDEX_COMPLETE: "yes"})
        return index

    def _scan_metadata(self) -> Iterator[tuple[str, Mapping[str, Any]]]:
        """(item id, metadata) of every item, read in pages (no documents, no vectors)."""
        offset, page = 0, min(self._max_batch(), 5000)
        while True:
            with chroma_errors("read the rubric bank", BankError):
                got = self._collection.get(limit=page, offset=offset, include=["metadatas"])
            if not got["ids"]:
                return
            for item_id, meta in zip(got["ids"], got["metadatas"] or [], strict=True):
                yield item_id, meta or {}
            offset += len(got["ids"])

    def _scan_shas(self) -> Iterator[tuple[str, str]]:
        """(item id, question hash) of every item."""
        return ((i, str(m.get("question_sha", ""))) for i, m in self._scan_metadata())

    def _index_read(self, shas: Iterable[str]) -> dict[str, set[str]]:
        """The indexed item ids per question hash (hashes without items are absent)."""
        out: dict[str, set[str]] = {}
        wanted = sorted({s for s in shas if s})
        for chunk in _chunks(wanted, self._max_batch()):
            with chroma_errors("read the rubric bank's question index", BankError):
                got = self._index.get(ids=chunk, include=["metadatas"])
                for sha, meta in zip(got["ids"], got["metadatas"] or [], strict=True):
                    out[sha] = _index_ids(meta)  # a damaged record raises ValueError: mapped to BankError
        return out

    def _index_update(self, *, add: Iterable[tuple[str, str]] = (), remove: Iterable[tuple[str, str]] = ()) -> None:
        """Add and remove (question hash, item id) pairs (caller holds the lock: read, change, write back)."""
        adds: dict[str, set[str]] = {}
        removes: dict[str, set[str]] = {}
        for target, pairs in ((adds, add), (removes, remove)):
            for sha, item_id in pairs:
                if sha:  # an item without a hash can never be looked up by one
                    target.setdefault(sha, set()).add(item_id)
        current = self._index_read([*adds, *removes])
        upserts: dict[str, set[str]] = {}
        deletes: list[str] = []
        for sha in sorted({*adds, *removes}):
            ids = (current.get(sha, set()) | adds.get(sha, set())) - removes.get(sha, set())
            if ids != current.get(sha, set()):
                if ids:
                    upserts[sha] = ids
                elif sha in current:
                    deletes.append(sha)
        batch = self._max_batch()
        with chroma_errors("write the rubric bank's question index", BankError):
            keys = list(upserts)
            for start in range(0, len(keys), batch):
                chunk = keys[start:start + batch]
                self._index.upsert(
                    ids=chunk, embeddings=[_index_vector(sha) for sha in chunk],  # type: ignore[arg-type]
                    metadatas=[{"ids": json.dumps(sorted(upserts[sha]))} for sha in chunk],
                )
            for chunk in _chunks(deletes, batch):
                self._index.delete(ids=chunk)

    def _by_sha(self, shas: Iterable[str]) -> dict[str, list[BankItem]]:
        """The items of each question hash, newest first (two lookups by id: the index, then the items)."""
        wanted = set(shas)
        indexed = self._index_read(wanted)
        ids = sorted({i for group in indexed.values() for i in group})
        out: dict[str, list[BankItem]] = {}
        for chunk in _chunks(ids, self._max_batch()):
            with chroma_errors("read the rubric bank", BankError):
                got = self._collection.get(ids=chunk, include=["documents", "metadatas"])
            docs, metas = got["documents"] or [], got["metadatas"] or []
            for item in (_item(i, d, m) for i, d, m in zip(got["ids"], docs, metas, strict=True)):
                if item.question_sha in wanted:  # an id indexed under a hash its item no longer has is skipped
                    out.setdefault(item.question_sha, []).append(item)
        for items in out.values():
            items.sort(key=lambda it: _parse_time(it.created_at), reverse=True)
        return out

    # ---- embedding -----------------------------------------------------------------------------------------

    def embed(self, questions: Sequence[str]) -> list[list[float]]:
        """Normalised question embeddings with the bank's model."""
        with chroma_errors("embed bank questions", BankError):
            return [_vector(v) for v in embed_texts(list(questions), self.config.embedding_model)]

    def _query_vector(self, question: str) -> list[float]:
        """The question's normalised embedding (the same vector as `embed([question])[0]`, cached per process)."""
        with chroma_errors("embed bank questions", BankError):
            return _vector(embed_query(question, self.config.embedding_model))

    # ---- reading -------------------------------------------------------------------------------------------

    def count(self) -> int:
        """Number of items (Chroma counts by a scan: about 7 ms at 100,000 items, so retrieval never asks)."""
        with chroma_errors("count the rubric bank", BankError):
            return self._collection.count()

    def get(self, item_id: str) -> BankItem:
        """The item with this id.

        Raises:
            BankItemNotFound: no such id.
        """
        with chroma_errors("read the rubric bank", BankError):
            got = self._collection.get(ids=[item_id], include=["documents", "metadatas"])
        if not got["ids"]:
            raise BankItemNotFound(f"no rubric-bank item {item_id!r}")
        docs, metas = got["documents"] or [], got["metadatas"] or []
        return _item(got["ids"][0], docs[0] if docs else None, metas[0] if metas else None)

    def by_question(self, question: str) -> BankItem | None:
        """The newest item for exactly this (normalised) question, or None."""
        sha = question_sha(question)
        items = self._by_sha([sha]).get(sha)
        return items[0] if items else None

    def items(self, *, batch: int = 1000) -> Iterator[BankItem]:
        """Every item (no particular order), read in pages."""
        offset = 0
        while True:
            with chroma_errors("read the rubric bank", BankError):
                got = self._collection.get(limit=batch, offset=offset, include=["documents", "metadatas"])
            if not got["ids"]:
                return
            docs, metas = got["documents"] or [], got["metadatas"] or []
            yield from (_item(i, d, m) for i, d, m in zip(got["ids"], docs, metas, strict=True))
            offset += len(got["ids"])

    def list_items(self, limit: int | None = None) -> list[BankItem]:
        """Items newest first (at most `limit`)."""
        items = sorted(self.items(), key=lambda it: _parse_time(it.created_at), reverse=True)
        return items[:limit] if limit is not None else items

    def search(
        self,
        question: str,
        k: int,
        *,
        exclude_sha: str | None = None,
        embedding: Sequence[float] | np.ndarray | None = None,
        hidden: Callable[[Sequence[BankHit]], Iterable[str]] | None = None,
        hold_back: bool = True,
    ) -> list[BankHit]:
        """The `k` items most similar to `question` (cosine), best first, optionally excluding one question hash.

        `hidden` (given the hits found so far, the ids the caller may not see: other people's questions) makes the
        answer not depend on whether such items exist (issue 46): the search goes deeper until k hits survive, and
        when it reaches the end of the bank it answers at most the bank's size less HELD_BACK hits, so a bank short
        of k hits for the caller does not answer one hit fewer for a question someone else asked. `hold_back=False`
        (a bank of one actor that only leaves out held-out items: nothing there is private) skips that last rule.
        """
        if k <= 0:
            return []
        vec = _vector(embedding) if embedding is not None else self._query_vector(question)
        # The excluded question is filtered here, not with a Chroma `$ne` filter: that turns into an allow-list of
        # every other id and costs ~250 ms at 100k items, against ~1 ms for a plain top-(k + a few) query. No
        # `count()` first either (another scan): Chroma returns fewer results than asked only when the bank has no
        # more, which ends the deepening.
        depth = k + max(2, HELD_BACK) if exclude_sha or hidden else k
        while True:
            hits = self._nearest(vec, depth, None)
            unseen = set(hidden(hits)) if hidden is not None else set()
            kept = [h for h in hits if h.item.question_sha != exclude_sha and h.item.id not in unseen]
            whole_bank = len(hits) < depth
            if whole_bank and hidden is not None and hold_back:
                return kept[:max(0, min(k, len(hits) - HELD_BACK))]
            if len(kept) >= k or whole_bank:
                return kept[:k]
            depth *= 4

    def retrieve(
        self,
        question: str,
        *,
        mode: RequestedMode = "auto",
        k: int | None = None,
        min_similarity: float | None = None,
        embedding: Sequence[float] | np.ndarray | None = None,
    ) -> Retrieval:
        """Bank items for a new question (METHOD §7.2).

        auto: within-episode if this exact question has an item, else cross-episode. within / cross: only that mode
        (the training curriculum asks for one explicitly). Cross-episode never returns the question's own item.

        With `owners` (the app's shared bank), an item counts for the same question only when it was reflected from
        one of the asker's own sessions (`store.owner.current_actor`): anyone else's item of that question, or an
        item whose session is unknown (deleted, imported, a training rollout's), is neither a within-episode hit nor a
        cross-episode one, and neither is another person's near-identical question (similarity at or above
        `dedup_similarity`, the bank's own "same question in other words"). So nobody can test whether someone else
        asked a question: those items are left out before the top k are taken (`search` with `hidden`), so the
        number of items is the same as if they did not exist, and similarities are coarse (`coarse_similarity`).
        Cross-episode, the asker's own items come first and others' fill the rest (`_shared_cross`, issue 65), and
        an item of a team that is not the asker's and does not share (`teams.share_global`) never reaches them.

        Args:
            question: the user's question (only the question is embedded).
            mode: "auto", "within" or "cross".
            k: cross-episode items (default: settings, 2).
            min_similarity: cosine threshold for cross-episode items (default: settings).
            embedding: a precomputed query embedding (skips the embedding model).
        """
        if mode not in ("auto", "within", "cross"):
            raise InvalidInput(f"retrieval mode must be auto, within or cross, got {mode!r}")
        sha = question_sha(question)
        if mode in ("auto", "within"):
            own = self._unguarded(self._askers_own(self._by_sha([sha]).get(sha) or []))
            if own:
                return Retrieval("within", (BankHit(own[0], 1.0),))
            if mode == "within":
                return Retrieval("none")
        threshold = self.config.min_similarity if min_similarity is None else min_similarity
        top_k = self.config.top_k if k is None else k
        if self._owners is not None:
            hits = self._shared_cross(question, sha, top_k, threshold, embedding)
        else:
            found = self.search(question, top_k, exclude_sha=sha, embedding=embedding,
                                hidden=self._hidden if self._heldout is not None else None, hold_back=False)
            hits = [BankHit(withhold_question(h.item), h.similarity) for h in found if h.similarity >= threshold]
        return Retrieval("cross", tuple(hits)) if hits else Retrieval("none")

    def _shared_cross(self, question: str, sha: str, k: int, threshold: float,
                      embedding: Sequence[float] | np.ndarray | None) -> list[BankHit]:
        """Cross-episode hits of the app's shared bank: the asker's own items first, then others' to fill the k.

        Own first (issue 65): the chat names the asker's own items among those used, so which of them are used must
        not depend on anyone else's items; a similar question someone else asked would otherwise push one of them
        out of the top k and show that it was asked. Others' items fill what is left, less those on (nearly) this
        question, those of a team that is not the asker's and does not share, and held-out ones; they reach the
        prompt as rubrics and takeaways only. Every similarity is on the 0.1 grid; best first overall."""
        if k <= 0:
            return []
        vec = _vector(embedding) if embedding is not None else self._query_vector(question)
        asker = current_actor().owner
        own = [h for h in self.search_own(question, k, asker, exclude_sha=sha, embedding=vec)
               if h.similarity >= threshold]
        others: list[BankHit] = []
        if len(own) < k:
            found = self.search(question, k - len(own), exclude_sha=sha, embedding=vec,
                                hidden=lambda hits: self._not_for_others_slots(asker, hits), hold_back=True)
            others = [h for h in found if h.similarity >= threshold]
        hits = [BankHit(withhold_question(h.item), coarse_similarity(h.similarity)) for h in [*own, *others]]
        return sorted(hits, key=lambda h: -h.similarity)  # stable: an own item first on a tie

    def _not_for_others_slots(self, asker: str, hits: Sequence[BankHit]) -> set[str]:
        """The ids a shared cross-episode search leaves out of the slots own items left: held-out items, the
        asker's own items (already taken or below the threshold), others' on (nearly) the question, and items of
        teams that keep theirs (`SessionOwners.unshared_with`)."""
        if not hits:
            return set()
        owners = self._owners
        assert owners is not None  # only a shared bank's retrieval calls this
        sessions = sorted({h.item.session_id for h in hits})
        of = owners.owners_of(sessions)
        own = {h.item.id for h in hits if of.get(h.item.session_id) == asker}
        near = {h.item.id for h in hits if h.similarity >= self.config.dedup_similarity}
        kept_back = set(owners.unshared_with(asker, sessions))
        unshared = {h.item.id for h in hits if h.item.session_id in kept_back}
        return self._hidden(hits) | own | near | unshared

    def search_own(
        self,
        question: str,
        k: int,
        owner: str,
        *,
        exclude_sha: str | None = None,
        embedding: Sequence[float] | np.ndarray | None = None,
    ) -> list[BankHit]:
        """The `k` items reflected from `owner`'s own sessions most similar to `question`, best first (exact
        similarities; held-out items left out).

        Why a search of its own: what a person is shown of the bank (MCP `search_bank`, the chat's "Reflections
        used") must be a function of their own data only, or a guess at someone else's question can be tested
        against it (issue 65). It asks Chroma for items of the owner's sessions only, so nobody else's item is read,
        ranked or held back. A bank without `owners` cannot tell whose an item is: it answers nothing, never
        everything.
        """
        if k <= 0 or self._owners is None:
            return []
        sessions = sorted(set(self._owners.sessions_of(owner)))
        if not sessions:
            return []
        vec = _vector(embedding) if embedding is not None else self._query_vector(question)
        found: list[BankHit] = []
        for chunk in _chunks(sessions, OWN_SESSIONS_PER_QUERY):
            depth = k + 2
            while True:
                got = self._nearest(vec, depth, {"session_id": {"$in": chunk}})
                usable = {i.id for i in self._unguarded([h.item for h in got])}
                kept = [h for h in got if h.item.question_sha != exclude_sha and h.item.id in usable]
                if len(kept) >= k or len(got) < depth:
                    break
                depth *= 4
            found += kept[:k]
        return sorted(found, key=lambda h: -h.similarity)[:k]

    def _nearest(self, vec: list[float], n: int, where: dict[str, Any] | None) -> list[BankHit]:
        """The `n` items nearest `vec` among those matching `where` (None: all), best first (fewer only when fewer
        match). A Chroma server answers a query on vectors not yet on disk with NOT_ON_DISK: an empty bank has no
        hits, a writer's first add in flight is waited for (store.chroma.read_unless_empty)."""
        def count() -> int:
            with chroma_errors("count the rubric bank", BankError):
                return self._collection.count()

        def query() -> Any:
            with chroma_errors("search the rubric bank", BankError):
                return self._collection.query(
                    query_embeddings=[vec], n_results=n, where=where,  # type: ignore[arg-type]
                    include=["documents", "metadatas", "distances"])

        res = read_unless_empty(query, count, None)
        if res is None:
            return []
        ids, docs = res["ids"][0], (res["documents"] or [[]])[0]
        metas, dists = (res["metadatas"] or [[]])[0], (res["distances"] or [[]])[0]
        return [BankHit(_item(i, d, m), 1.0 - float(dist)) for i, d, m, dist in zip(ids, docs, metas, dists,
                                                                                       strict=True)]

    def owned_by(self, item_ids: Sequence[str], owner: str) -> list[BankItem]:
        """The items among `item_ids` (in that order; missing ones skipped) reflected from `owner`'s own sessions:
        the only ones a person is shown by id and question (the chat's "Reflections used", issue 65). A bank
        without `owners` cannot tell whose an item is: none."""
        wanted = list(dict.fromkeys(item_ids))
        if not wanted or self._owners is None:
            return []
        got: dict[str, BankItem] = {}
        for chunk in _chunks(wanted, self._max_batch()):
            with chroma_errors("read the rubric bank", BankError):
                res = self._collection.get(ids=chunk, include=["documents", "metadatas"])
            docs, metas = res["documents"] or [], res["metadatas"] or []
            got.update({i: _item(i, d, m) for i, d, m in zip(res["ids"], docs, metas, strict=True)})
        items = [got[i] for i in wanted if i in got]
        of = self._owners.owners_of(sorted({i.session_id for i in items}))
        return [i for i in items if of.get(i.session_id) == owner]

    def _unguarded(self, items: Sequence[BankItem]) -> list[BankItem]:
        """`items` less those derived from a held-out question, each refusal logged with both ids (an item stored
        before the guard existed, or by a process without one: it is left in place for `rubricem bank delete`)."""
        if self._heldout is None:
            return list(items)
        kept = []
        for item in items:
            found = self._heldout.item_id(item)
            if found is None:
                kept.append(item)
            else:
                _log.warning("rubric bank item %s is derived from held-out question %s: not retrieved", item.id,
                             found)
        return kept

    def _hidden(self, hits: Sequence[BankHit]) -> set[str]:
        """The ids a one-actor bank's search leaves out: items derived from held-out questions (the search goes
        deeper so that k hits still come back). A shared bank leaves out more: `_not_for_others_slots`."""
        items = [h.item for h in hits]
        return {i.id for i in items} - {i.id for i in self._unguarded(items)}

    def _askers_own(self, items: Sequence[BankItem]) -> list[BankItem]:
        """The items reflected from the asker's own sessions (all of them for a bank without `owners`)."""
        if self._owners is None or not items:
            return list(items)
        asker = current_actor().owner
        owners = self._owners.owners_of(sorted({i.session_id for i in items}))
        return [i for i in items if owners.get(i.session_id) == asker]

    # ---- writing -------------------------------------------------------------------------------------------

    def put(self, item: BankItem, embedding: Sequence[float] | np.ndarray | None = None) -> PutResult:
        """Store an item, replacing the item(s) of the same or a near-identical question.

        Not stored (PutResult.stored False, with the reason) when an item for that question is newer.

        Raises:
            InvalidInput: the item is incomplete or inconsistent (nothing written).
            BankError: Chroma failed (the bank holds the old item, or the old and the new one).
        """
        validate_item(item)
        if self._heldout is not None:
            self._heldout.refuse(item)
        vec = _vector(embedding) if embedding is not None else self.embed([item.question])[0]
        with self._lock:
            olds = {it.id: it for it in self._by_sha([item.question_sha]).get(item.question_sha, [])}
            for hit in self.search(item.question, 5, embedding=vec):
                if hit.similarity >= self.config.dedup_similarity:
                    olds[hit.item.id] = hit.item
            olds.pop(item.id, None)
            newer = [o for o in olds.values() if _parse_time(o.created_at) > _parse_time(item.created_at)]
            if newer:
                return PutResult(item, False, reason=f"item {newer[0].id} for this question is newer")
            self._index_update(add=[(item.question_sha, item.id)])  # index first: it must never miss an item
            with chroma_errors("write to the rubric bank", BankError):
                self._collection.upsert(
                    ids=[item.id], documents=[item.question], embeddings=[vec],  # type: ignore[arg-type]
                    metadatas=[_metadata(item)],  # type: ignore[list-item]
                )
                if olds:
                    self._collection.delete(ids=list(olds))
            self._index_update(remove=[(o.question_sha, o.id) for o in olds.values()])
            self._retained_update(add=[item], remove=olds)
            evicted = self._evict()
        return PutResult(item, True, replaced=tuple(olds), evicted=evicted)

    def add_many(
        self,
        items: Sequence[BankItem],
        embeddings: Sequence[Sequence[float]] | np.ndarray | None = None,
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> ImportResult:
        """Bulk load (imports, benchmarks): validate all first, then write in batches.

        Same question-hash rules as `put` (newest wins, within the batch too), but no near-duplicate check per item:
        run `dedupe()` afterwards for that.

        Raises:
            InvalidInput: an item or embedding is invalid (nothing written).
        """
        for n, it in enumerate(items, start=1):
            validate_item(it)
            if self._heldout is not None:  # the whole batch is refused before anything is written
                self._heldout.refuse(it, f"item {n} of {len(items)} ({it.id})")
        if embeddings is not None and len(embeddings) != len(items):
            raise InvalidInput(f"{len(embeddings)} embeddings for {len(items)} items")
        vectors = [_vector(e) for e in embeddings] if embeddings is not None else None
        newest: dict[str, int] = {}
        for i, it in enumerate(items):
            j = newest.get(it.question_sha)
            if j is None or _parse_time(it.created_at) >= _parse_time(items[j].created_at):
                newest[it.question_sha] = i
        keep = sorted(newest.values())
        stored = replaced = 0
        with self._lock:
            batch = max(1, min(self._max_batch(), 2000))
            for start in range(0, len(keep), batch):
                chunk = [items[i] for i in keep[start:start + batch]]
                vecs = [vectors[i] for i in keep[start:start + batch]] if vectors is not None else self.embed(
                    [it.question for it in chunk])
                by_sha = self._by_sha(it.question_sha for it in chunk)
                write_items, write_vecs, drop = [], [], []
                for it, v in zip(chunk, vecs, strict=True):
                    existing = [o for o in by_sha.get(it.question_sha, []) if o.id != it.id]
                    if any(_parse_time(o.created_at) > _parse_time(it.created_at) for o in existing):
                        continue
                    write_items.append(it)
                    write_vecs.append(v)
                    drop += existing
                self._index_update(add=[(it.question_sha, it.id) for it in write_items])
                with chroma_errors("write to the rubric bank", BankError):
                    if write_items:
                        self._collection.upsert(
                            ids=[it.id for it in write_items], documents=[it.question for it in write_items],
                            embeddings=write_vecs,  # type: ignore[arg-type]
                            metadatas=[_metadata(it) for it in write_items],  # type: ignore[misc]
                        )
                    if drop:
                        self._collection.delete(ids=[o.id for o in drop])
                self._index_update(remove=[(o.question_sha, o.id) for o in drop])
                self._retained_update(add=write_items, remove=[o.id for o in drop])
                stored += len(write_items)
                replaced += len(drop)
                if progress is not None:
                    progress(min(start + batch, len(keep)), len(keep))
            evicted = self._evict()
        return ImportResult(read=len(items), stored=stored, replaced=replaced, skipped=len(items) - stored,
                            evicted=len(evicted))

    def delete(self, item_id: str) -> None:
        """Remove one item.

        Raises:
            BankItemNotFound: no such id.
        """
        with self._lock:
            item = self.get(item_id)
            with chroma_errors("delete from the rubric bank", BankError):
                self._collection.delete(ids=[item_id])
            self._index_update(remove=[(item.question_sha, item.id)])
            self._retained_update(remove=[item_id])

    def delete_derived(self, session_ids: Sequence[str], item_ids: Sequence[str] = ()) -> int:
        """Remove the items reflected from these sessions (by their `session_id`, which also finds items imported
        or re-stored under another id) and these item ids. Idempotent: what is already gone is skipped, so a
        deletion interrupted after its database commit is simply run again. Returns how many items were removed."""
        with self._lock:
            found: dict[str, str] = {}
            for chunk in _chunks(sorted(set(session_ids)), self._max_batch()):
                with chroma_errors("read the rubric bank", BankError):
                    got = self._collection.get(where={"session_id": {"$in": chunk}}, include=["metadatas"])
                for item_id, meta in zip(got["ids"], got["metadatas"] or [], strict=True):
                    found[item_id] = str((meta or {}).get("question_sha", ""))
            for chunk in _chunks(sorted(set(item_ids) - set(found)), self._max_batch()):
                with chroma_errors("read the rubric bank", BankError):
                    got = self._collection.get(ids=chunk, include=["metadatas"])
                for item_id, meta in zip(got["ids"], got["metadatas"] or [], strict=True):
                    found[item_id] = str((meta or {}).get("question_sha", ""))
            with chroma_errors("delete from the rubric bank", BankError):
                for chunk in _chunks(sorted(found), self._max_batch()):
                    self._collection.delete(ids=chunk)
            self._index_update(remove=[(sha, i) for i, sha in found.items()])
            self._retained_update(remove=found)
        return len(found)

    def clear(self) -> int:
        """Remove every item; returns how many there were."""
        with self._lock:
            pairs = list(self._scan_shas())
            with chroma_errors("clear the rubric bank", BankError):
                for chunk in _chunks([i for i, _ in pairs], self._max_batch()):
                    self._collection.delete(ids=chunk)
            self._index_update(remove=[(sha, i) for i, sha in pairs])
            self._retained_update(remove=[i for i, _ in pairs])
        return len(pairs)

    def run_collection(self, cycle_id: str) -> str:
        """The collection a retraining cycle's own reflections go to (`app.training`: `<bank>_run_<cycle>`)."""
        return f"{self.config.collection}_run_{cycle_id}"

    def drop_run_collection(self, cycle_id: str) -> bool:
        """Drop a finished cycle's own bank collection and its question index (a deletion's copies, issue 34; the
        run folder's retention). Idempotent: returns False when there was none. Never this bank's own collection.

        Raises:
            BankError: Chroma failed.
        """
        name = self.run_collection(cycle_id)
        if not cycle_id or name == self.config.collection:
            raise InvalidInput(f"not a cycle id: {cycle_id!r}")
        dropped = False
        with chroma_errors(f"drop the run collection {name!r}", BankError):
            for each in (name, name + INDEX_SUFFIX):
                try:
                    self._client.delete_collection(each)
                except NotFoundError:
                    continue
                dropped = dropped or each == name
        return dropped

    def dedupe(self) -> list[str]:
        """Remove near-identical items (question cosine >= dedup_similarity), keeping the newest of each group.

        Returns the removed ids. Cost is quadratic in the bank size (blocked matrix products), so this is a
        maintenance command, not a per-request step.
        """
        with self._lock:
            ids, shas, times, vecs = self._all_vectors()
            if len(ids) < 2:
                return []
            order = np.argsort(-np.asarray(times), kind="stable")  # newest first: the newest of a group is kept
            mat = np.asarray(vecs, dtype=np.float32)[order]
            kept: list[int] = []
            removed: list[int] = []
            for row in range(len(order)):
                if kept and float(np.max(mat[kept] @ mat[row])) >= self.config.dedup_similarity:
                    removed.append(int(order[row]))
                else:
                    kept.append(row)
            with chroma_errors("deduplicate the rubric bank", BankError):
                for chunk in _chunks([ids[r] for r in removed], self._max_batch()):
                    self._collection.delete(ids=chunk)
            self._index_update(remove=[(shas[r], ids[r]) for r in removed])
            self._retained_update(remove=[ids[r] for r in removed])
        return [ids[r] for r in removed]

    def _all_vectors(self) -> tuple[list[str], list[str], list[float], list[list[float]]]:
        ids: list[str] = []
        shas: list[str] = []
        times: list[float] = []
        vecs: list[list[float]] = []
        offset = 0
        while True:
            with chroma_errors("read the rubric bank", BankError):
                got = self._collection.get(limit=2000, offset=offset, include=["metadatas", "embeddings"])
            if not got["ids"]:
                return ids, shas, times, vecs
            metas = got["metadatas"] or []
            embs = got["embeddings"] if got["embeddings"] is not None else []
            for i, m, e in zip(got["ids"], metas, embs, strict=True):
                ids.append(i)
                shas.append(str((m or {}).get("question_sha", "")))
                ts = (m or {}).get("created_ts", 0.0)
                times.append(float(ts) if isinstance(ts, int | float) else 0.0)
                vecs.append(list(e))
            offset += len(got["ids"])

    def _evict(self) -> tuple[str, ...]:
        """Drop the lowest-retention items beyond capacity (caller holds the lock).

        Ranking needs each item's score, creation time and question hash, not its text: they are kept in memory
        (`_retained`, built by one metadata scan at the first eviction, then kept up to date by this instance's
        writes), so a write to a full bank ranks in memory instead of reading all 100k items back (about 10 s).
        Another process's writes change the count or remove a victim: either rebuilds the ranking first.
        """
        n = self.count()
        excess = n - self.config.capacity
        if excess <= 0:
            return ()
        for attempt in range(2):
            if self._retained is None or len(self._retained) != n or attempt:
                self._retained = dict(self._scan_retained())
            now_ts, half_life = self._clock().timestamp(), self.config.half_life_days
            # retention() on the cached (score, created_ts, question_sha); ties go to the older item.
            victims = heapq.nsmallest(excess, self._retained.items(), key=lambda kv: (
                decayed_score(kv[1][0], now_ts - kv[1][1], half_life), kv[1][1]))
            ids = [i for i, _ in victims]
            with chroma_errors("read the rubric bank", BankError):
                present = set(self._collection.get(ids=ids, include=[])["ids"])
            if len(present) == len(ids):
                break
        with chroma_errors("evict from the rubric bank", BankError):
            for chunk in _chunks(ids, self._max_batch()):
                self._collection.delete(ids=chunk)
        self._index_update(remove=[(meta[2], i) for i, meta in victims])
        for i in ids:
            self._retained.pop(i, None)
        return tuple(ids)

    def _scan_retained(self) -> Iterator[tuple[str, tuple[float, float, str]]]:
        """(id, (score, creation time as a POSIX timestamp, question hash)) of every item: what eviction ranks by,
        read in pages."""
        for item_id, m in self._scan_metadata():
            yield item_id, (float(m.get("score", 0.0)),  # type: ignore[arg-type]
                            _parse_time(str(m.get("created_at", ""))).timestamp(), str(m.get("question_sha", "")))

    def _retained_update(self, add: Iterable[BankItem] = (), remove: Iterable[str] = ()) -> None:
        """Keep the in-memory eviction ranking in step with this instance's writes (nothing to do before the first
        eviction built it)."""
        if self._retained is None:
            return
        for i in remove:
            self._retained.pop(i, None)
        for it in add:
            self._retained[it.id] = (it.score, _parse_time(it.created_at).timestamp(), it.question_sha)

    def _max_batch(self) -> int:
        if self._batch is None:
            try:
                self._batch = int(self._client.get_max_batch_size())
            except Exception:  # noqa: BLE001 - older servers lack the endpoint; Chroma's documented floor is safe
                self._batch = 5000
        return self._batch

    # ---- export / import -----------------------------------------------------------------------------------

    def export_jsonl(self, path: Path) -> int:
        """Write every item (newest first) as JSON lines, atomically (temp file + rename); returns the count.

        Embeddings are not exported: an import re-embeds with the importing bank's model.
        """
        items = self.list_items()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                for it in items:
                    out.write(json.dumps(asdict(it), ensure_ascii=False) + "\n")
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return len(items)

    def import_jsonl(self, path: Path, progress: Callable[[int, int], None] | None = None) -> ImportResult:
        """Read an export and add its items (newest per question wins); a bad line aborts before any write.

        Raises:
            InvalidInput: the file is missing, not JSON lines, or an item is invalid (message names the line).
        """
        items = list(read_jsonl(Path(path)))
        return self.add_many(items, progress=progress)


def read_jsonl(path: Path) -> Iterable[BankItem]:
    """Parse and validate a bank export; raise InvalidInput naming the first bad line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read {path}: {exc}") from exc
    out: list[BankItem] = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            if not isinstance(data, dict):
                raise TypeError("not a JSON object")
            missing = [f for f in _FIELDS if f not in data]
            if missing:
                raise KeyError(f"missing fields {missing}")
            item = BankItem(**{f: data[f] for f in _FIELDS})
            validate_item(item)
        except (ValueError, TypeError, KeyError) as exc:
            raise InvalidInput(f"{path}:{n}: not a valid bank item: {exc}") from exc
        out.append(item)
    return out


def _chunks(seq: Sequence[str], size: int) -> Iterator[list[str]]:
    for i in range(0, len(seq), max(1, size)):
        yield list(seq[i:i + size])
