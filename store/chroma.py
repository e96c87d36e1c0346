"""The Chroma connection shared by the document index and the rubric bank: one client per settings, typed errors.

Embedded mode opens a `PersistentClient` under the data folder; server mode an `HttpClient` to `chroma run` (the
deployment where the app and the trainer share one bank and one index).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import chromadb
import httpx
from chromadb.api import ClientAPI
from chromadb.errors import ChromaError

from store.config import StoreConfig
from store.embeddings import EmbeddingModelError
from store.errors import StoreError

CHROMA_FAILURES: tuple[type[BaseException], ...] = (
    ChromaError, httpx.HTTPError, ConnectionError, OSError, ValueError, EmbeddingModelError,
)
"""What Chroma, its HTTP transport and the embedding model raise when they fail (mapped by type, never message)."""


@contextmanager
def chroma_errors(action: str, error: type[StoreError]) -> Iterator[None]:
    """Re-raise Chroma/transport/model failures as `error("could not <action>: ...")`; project errors pass."""
    try:
        yield
    except StoreError:
        raise
    except CHROMA_FAILURES as exc:
        raise error(f"could not {action}: {type(exc).__name__}: {exc}") from exc


def open_chroma_client(config: StoreConfig, error: type[StoreError] = StoreError) -> ClientAPI:
    """A Chroma client per the config: embedded PersistentClient under data_dir, or HttpClient to a server.

    Raises:
        error: the folder cannot be created or the server cannot be reached.
    """
    with chroma_errors("open the Chroma database", error):
        if config.chroma_mode == "server":
            return chromadb.HttpClient(host=config.chroma_host, port=config.chroma_port)
        config.chroma_path.mkdir(parents=True, exist_ok=True)
        return chromadb.PersistentClient(path=str(config.chroma_path))
