"""Fixtures for the tool tests: a scriptable HTTP server on 127.0.0.1 and small real indexes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tools_support import LocalServer, sample_passages

from store.config import StoreConfig
from store.doc_index import DocIndex
from store.embeddings import load_model


@pytest.fixture(scope="session")
def _server() -> Iterator[LocalServer]:
    srv = LocalServer()
    yield srv
    srv.close()


@pytest.fixture
def server(_server: LocalServer) -> LocalServer:
    """The local HTTP server with no routes and an empty request log."""
    _server.routes.clear()
    _server.requests.clear()
    return _server


@pytest.fixture(scope="session")
def embedding_model() -> object:
    """Load the bundled MiniLM once per test run (about 3-10 s); every index in the run reuses it."""
    return load_model("")


@pytest.fixture
def store_config(tmp_path: Path, embedding_model: object) -> StoreConfig:
    """Embedded Chroma under a fresh temporary folder."""
    return StoreConfig(data_dir=tmp_path / "data", docs_collection="docs_test")


@pytest.fixture
def index(store_config: StoreConfig) -> DocIndex:
    """An empty embedded index."""
    return DocIndex(store_config)


@pytest.fixture(scope="module")
def passage_index(tmp_path_factory: pytest.TempPathFactory, embedding_model: object) -> DocIndex:
    """An embedded index of 40 real Wikipedia passages, built once per test module."""
    cfg = StoreConfig(data_dir=tmp_path_factory.mktemp("passages"), docs_collection="passages")
    idx = DocIndex(cfg)
    idx.add_documents(sample_passages())
    return idx
