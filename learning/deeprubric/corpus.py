"""Where trees start and how their nodes retrieve: seed pages of the local index, and `local_search` as a Retriever.

Decisions where METHOD §11 is silent:
- The seed pool is the pages of the local index: the bundled demo corpus's passages (one Wikipedia page each), or,
  for a user's own files, the first chunk of each indexed file (re-read from disk; a file that is gone is skipped).
  Pages whose text gives fewer than 2 statements are too thin to seed a tree and are left out.
- Seed i of a build with seed S is drawn by `random.Random(f"{S}:{i}")` among the pages not drawn before, so a
  build with more seeds extends a smaller one with the same first trees (and a rerun resumes them).
- With `--topic T`, the seeds are the distinct pages `local_search` ranks highest for T (up to 50), in rank order,
  and each tree is rooted at its page; the topic is recorded with the build.
- Each tree gets its own call-id generator seeded by its key, so its snippet ids are unique within the tree and the
  same on every rerun.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.errors import IngestError, SearchError
from agent.ingest import DEMO_SOURCE_PREFIX, load_demo_corpus, load_documents
from agent.tools.ids import CallIdFactory
from agent.tools.local_search import LocalSearch
from learning.deeprubric.records import Passage, stable_hex
from learning.deeprubric.text import sentences, trim_statement

TOPIC_POOL = 50
MIN_SEED_STATEMENTS = 2


@dataclass(frozen=True, slots=True)
class SeedPage:
    """A page a tree can start from."""

    title: str
    text: str
    source: str


def usable(page: SeedPage) -> bool:
    """Whether the page gives at least MIN_SEED_STATEMENTS statements and has a title."""
    return bool(page.title.strip()) and sum(trim_statement(s) is not None for s in sentences(page.text)) >= \
        MIN_SEED_STATEMENTS


def index_pages(sources: Sequence[str]) -> list[SeedPage]:
    """The usable pages of the indexed `sources` (DocIndex.sources()), in a stable order."""
    pages: list[SeedPage] = []
    demo = sorted(s[len(DEMO_SOURCE_PREFIX):] for s in sources if s.startswith(DEMO_SOURCE_PREFIX))
    if demo:
        pages.extend(SeedPage(d.title, d.text, d.source) for d in load_demo_corpus(demo))
    for source in sorted(s for s in sources if not s.startswith(DEMO_SOURCE_PREFIX)):
        try:
            docs = load_documents(Path(source))
        except IngestError:
            continue
        if docs:
            pages.append(SeedPage(docs[0].title or Path(source).stem, docs[0].text, source))
    seen: set[str] = set()
    out = []
    for p in pages:
        if usable(p) and p.title not in seen:
            seen.add(p.title)
            out.append(p)
    return out


def draw_seeds(pages: Sequence[SeedPage], n: int, seed: int) -> list[tuple[str, SeedPage]]:
    """`n` distinct pages with their keys (`s{seed}-{i}`); ValueError if the pool is smaller than `n`."""
    if n > len(pages):
        raise ValueError(f"--seeds {n}: the local index has only {len(pages)} usable seed pages")
    left = list(range(len(pages)))
    out = []
    for i in range(n):
        pick = random.Random(f"{seed}:{i}").randrange(len(left))
        out.append((f"s{seed}-{i}", pages[left.pop(pick)]))
    return out


class LocalRetriever:
    """A tree's Retriever: the project's `local_search` tool, with call ids seeded by the tree key."""

    def __init__(self, search: LocalSearch, key: str) -> None:
        self.search = search
        self.ids = CallIdFactory(seed=int(stable_hex(key, 12), 16))

    async def __call__(self, query: str) -> list[Passage]:
        """The passages local_search returns; a search error counts as an empty retrieval."""
        try:
            snippets = await self.search(query, {}, self.ids())
        except SearchError:
            return []
        out = []
        for s in snippets:
            clipped = s.text.endswith("…") and len(s.text) >= self.search.snippet_chars
            text = s.text[:-1] if clipped else s.text
            out.append(Passage(id=s.id, title=s.title, text=text, url=s.url, clipped=clipped))
        return out


async def topic_seeds(search: LocalSearch, topic: str, n: int) -> list[tuple[str, SeedPage]]:
    """The `n` best distinct pages for `topic` (keys `t{hash}-{i}`); ValueError if there are fewer."""
    snippets = await search(topic, {"limit": str(TOPIC_POOL)}, "00000000")
    pages: list[SeedPage] = []
    for s in snippets:
        page = SeedPage(s.title, s.text.rstrip("…"), "local_search")
        if usable(page) and all(p.title != page.title for p in pages):
            pages.append(page)
    if n > len(pages):
        raise ValueError(f"--seeds {n}: local_search finds only {len(pages)} usable pages for topic {topic!r}")
    tag = stable_hex(" ".join(topic.lower().split()), 6)
    return [(f"t{tag}-{i}", p) for i, p in enumerate(pages[:n])]


__all__ = [
    "MIN_SEED_STATEMENTS",
    "TOPIC_POOL",
    "LocalRetriever",
    "SeedPage",
    "draw_seeds",
    "index_pages",
    "topic_seeds",
    "usable",
]
