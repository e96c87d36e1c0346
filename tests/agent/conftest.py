"""Fixtures for graph tests: a small real document index (embedded Chroma + offline MiniLM + BM25)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.tools.local_search import LocalSearch
from store.config import StoreConfig
from store.doc_index import DocIndex, Document

CORPUS = Path(__file__).resolve().parents[2] / "agent" / "demo_corpus" / "hotpotqa_train_corpus.json"


@pytest.fixture(scope="session")
def small_index(tmp_path_factory: pytest.TempPathFactory) -> DocIndex:
    """40 real Wikipedia passages (including Haymo of Faversham) in a fresh embedded index."""
    data = json.loads(CORPUS.read_text(encoding="utf-8"))
    titles = ["Haymo of Faversham"] + [t for t in data if t != "Haymo of Faversham"][:39]
    docs = [Document(source=f"test:{t}", chunk=0, text=" ".join(data[t]), title=t) for t in titles]
    index = DocIndex(StoreConfig(data_dir=tmp_path_factory.mktemp("agent-index")))
    index.add_documents(docs)
    return index


@pytest.fixture
def local_tools(small_index: DocIndex) -> dict[str, LocalSearch]:
    """The real local_search tool over the small index."""
    return {"local_search": LocalSearch(small_index, k=3, snippet_chars=300)}
