"""Fixtures for the tool tests: a scriptable HTTP server on 127.0.0.1, a real Chroma server, small real indexes."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tools_support import LocalServer, free_port, sample_passages

from store.config import StoreConfig
from store.doc_index import DocIndex
from store.embeddings import load_model

CHROMA_START_TIMEOUT_S = 30.0


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


@pytest.fixture(scope="session")
def chroma_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A real `chroma run` server on 127.0.0.1 (own data folder), stopped by pid at the end of the run."""
    port = free_port()
    data = tmp_path_factory.mktemp("chroma-server")
    log_path = data.parent / f"chroma-server-{port}.log"
    chroma = Path(sys.executable).parent / "chroma"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(chroma), "run", "--path", str(data), "--host", "127.0.0.1", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + CHROMA_START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"chroma server exited while starting:\n{log_path.read_text()[-2000:]}", pytrace=False)
            try:
                if httpx.get(f"http://127.0.0.1:{port}/api/v2/heartbeat", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("chroma server did not answer its heartbeat in time", pytrace=False)
            time.sleep(0.1)
        yield "127.0.0.1", port
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
