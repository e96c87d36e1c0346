"""Small real document indexes for tests: chosen passages of the bundled HotpotQA demo corpus."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

from store.config import StoreConfig
from store.doc_index import DocIndex, Document

DEMO_HOTPOT = Path(__file__).resolve().parents[1] / "agent" / "demo_corpus" / "hotpotqa_train_corpus.json"


def demo_hotpot_corpus() -> dict[str, list[str]]:
    """The bundled HotpotQA passages: title -> sentences."""
    return json.loads(DEMO_HOTPOT.read_text(encoding="utf-8"))


def passage_index(data_dir: Path, pick: Callable[[dict[str, list[str]]], Iterable[str]]) -> DocIndex:
    """A fresh embedded index (Chroma + MiniLM + BM25) holding the demo passages whose titles `pick` returns."""
    corpus = demo_hotpot_corpus()
    index = DocIndex(StoreConfig(data_dir=data_dir))
    index.add_documents(_documents(corpus, pick(corpus)))
    return index


def _documents(corpus: dict[str, list[str]], titles: Iterable[str]) -> list[Document]:
    return [Document(source=f"test:{t}", chunk=0, text=" ".join(corpus[t]), title=t) for t in titles]


SEED_TITLES = ("Haymo of Faversham", "David Smith (director)", "Christopher Nolan", "The Prestige (film)",
               "Lilu (mythology)")


def seed_passages(settings: object, titles: Iterable[str] = SEED_TITLES) -> None:
    """Index a few demo passages into `settings`' own document index as the operator's documents. The container then
    finds a corpus of the user's own and does not index the bundled demo corpus (about 7 s per fresh data folder,
    plus a BM25 over its 9,000 chunks in every process that opens it): for tests whose subject is not retrieval."""
    from app.container import open_index

    open_index(settings).add_documents(_documents(demo_hotpot_corpus(), titles))  # type: ignore[arg-type]
