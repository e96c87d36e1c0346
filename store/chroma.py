"""The Chroma connection shared by the document index and the rubric bank: one client per settings, typed errors.

Embedded mode opens a `PersistentClient` under the data folder; server mode an `HttpClient` to `chroma run` (the
deployment where the app and the trainer share one bank and one index).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import chromadb
import httpx
from chromadb.api import ClientAPI
from chromadb.api.models.Collection import Collection
from chromadb.errors import ChromaError, NotFoundError

from store.config import StoreConfig
from store.embeddings import EmbeddingModelError, SentenceTransformerEmbedding
from store.errors import StoreError

CHROMA_FAILURES: tuple[type[BaseException], ...] = (
    ChromaError, httpx.HTTPError, ConnectionError, OSError, ValueError, EmbeddingModelError,
)
"""What Chroma, its HTTP transport and the embedding model raise when they fail (mapped by type, never message)."""

NOT_ON_DISK = "Nothing found on disk"
"""A Chroma server's answer to a read of a collection whose vectors are not persisted yet: empty, or another
process's first add in flight (two app hosts starting together on a fresh server, a reader beside a writer)."""

T = TypeVar("T")


def read_unless_empty(read: Callable[[], T], count: Callable[[], int], empty: T, attempts: int = 4) -> T:
    """`read()`, or `empty` when it fails with NOT_ON_DISK on a collection that counts 0 items; a non-empty one is
    retried (with a short backoff) as its first vectors reach the disk. Any other error, or the last, propagates.

    `count` is only called after that error, so a normal read costs nothing extra."""
    for attempt in range(1, attempts + 1):
        try:
            return read()
        except StoreError as exc:
            if NOT_ON_DISK not in str(exc) or attempt == attempts:
                raise
            if count() == 0:
                return empty
            time.sleep(0.1 * attempt)
    raise AssertionError("unreachable")  # the loop returns or raises


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


META_MODEL = "embedding_model"


def open_collection(client: ClientAPI, name: str, model: str, error: type[StoreError], what: str,
                    metadata: dict[str, str] | None = None) -> tuple[Collection, str | None]:
    """Open or create a cosine collection embedded with `model` ("" = bundled MiniLM); returns it with the model it
    was built with (recorded in its metadata at creation), so the caller can refuse a mismatch."""
    ef = SentenceTransformerEmbedding(model)
    with chroma_errors(f"open {what} {name!r}", error):
        try:
            col = client.get_collection(name, embedding_function=ef)  # type: ignore[arg-type]
        except NotFoundError:
            col = client.get_or_create_collection(
                name,
                embedding_function=ef,  # type: ignore[arg-type]
                configuration={"hnsw": {"space": "cosine"}},
                metadata={META_MODEL: model, **(metadata or {})},
            )
    built_with = (col.metadata or {}).get(META_MODEL)
    return col, None if built_with is None else str(built_with)
