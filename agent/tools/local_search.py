"""`local_search`: hybrid (dense + BM25) search over the user's own document index (store.doc_index)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from agent.errors import SearchError
from agent.tools.ids import snippet_id
from agent.tools.web import clip, require_query
from store.doc_index import DocIndex, DocIndexError
from store.records import Snippet

MAX_K = 50


class LocalSearch:
    """Search the local document index; snippets carry the chunk's title, text (cut) and source URL if any."""

    name = "local_search"
    description = "Search the local document collection (Wikipedia passages and ingested files); argument: a query."

    def __init__(self, index: DocIndex, k: int = 5, snippet_chars: int = 700) -> None:
        """Serve `index`, returning `k` snippets per call (attribute limit="N" overrides, up to 50)."""
        self.index = index
        self.k = k
        self.snippet_chars = snippet_chars

    async def __call__(self, query: str, attrs: Mapping[str, str], call_id: str) -> Sequence[Snippet]:
        """Run one search. Raises SearchError for an empty query, a bad limit or an index failure."""
        query = require_query(self.name, query)
        k = self._k(attrs)
        try:
            # Embedding the query and BM25 scoring are blocking CPU work: keep them off the event loop.
            hits = await asyncio.to_thread(self.index.search, query, k)
        except DocIndexError as exc:
            raise SearchError(f"{self.name}: the local document index is unavailable") from exc
        return [
            Snippet(
                id=snippet_id(call_id, i),
                tool=self.name,
                title=hit.title,
                text=clip(hit.text, self.snippet_chars),
                url=hit.url,
            )
            for i, hit in enumerate(hits)
        ]

    def _k(self, attrs: Mapping[str, str]) -> int:
        raw = attrs.get("limit", attrs.get("k"))
        if raw is None:
            return self.k
        if not raw.strip().isdigit() or not 1 <= int(raw) <= MAX_K:
            raise SearchError(f"{self.name}: limit must be a whole number from 1 to {MAX_K}")
        return int(raw)
