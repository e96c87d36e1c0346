"""`rubricem ingest`: read txt, md, html, pdf and jsonl files (or folders of them) into chunks for the DocIndex.

Every file is read and checked before anything is written, so a bad file leaves the index unchanged. Also loads the
bundled Wikipedia demo corpus (agent/demo_corpus, see its ATTRIBUTION.md) into the index on first use.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.errors import IngestError
from store.doc_index import DocIndex, Document, ProgressFn

CHUNK_WORDS = 200
"""Words per chunk. all-MiniLM-L6-v2 reads at most 256 word pieces (about 190 English words), so longer chunks
would be embedded only in part; BM25 still sees every word."""

CHUNK_OVERLAP = 40
"""Words shared by consecutive chunks, so a sentence cut at a boundary is whole in one of them."""

MAX_FILE_BYTES = 100_000_000
TEXT_SUFFIXES = frozenset({".txt", ".text"})
MARKDOWN_SUFFIXES = frozenset({".md", ".markdown"})
HTML_SUFFIXES = frozenset({".html", ".htm", ".xhtml"})
SUPPORTED_SUFFIXES = TEXT_SUFFIXES | MARKDOWN_SUFFIXES | HTML_SUFFIXES | {".pdf", ".jsonl"}

DEMO_CORPUS_DIR = Path(__file__).resolve().parent / "demo_corpus"
DEMO_CORPUS_FILES = ("hotpotqa_train_corpus.json", "musique_train_corpus.json", "2wikimultihopqa_corpus.json")
DEMO_SOURCE_PREFIX = "demo:"


PDF_MAX_BYTES = 25_000_000
PDF_MAX_PAGES = 500
PDF_MAX_TEXT_CHARS = 5_000_000
_CONTENT_PER_CHAR = 4
"""Bytes of page content (drawing operators) allowed per character of the text cap, checked before extraction."""


@dataclass(frozen=True, slots=True)
class IngestLimits:
    """Caps on what one file may cost to read (issue 34). A PDF is small on disk but its streams are compressed: a
    "PDF bomb" of a few kilobytes can hold millions of pages or gigabytes of text, so its pages are counted before
    any text is extracted, and extraction stops once the text is over its cap. The UI takes them from
    `uploads` settings (RUBRICEM_UPLOADS__*)."""

    max_file_bytes: int = MAX_FILE_BYTES
    pdf_max_bytes: int = PDF_MAX_BYTES
    pdf_max_pages: int = PDF_MAX_PAGES
    pdf_max_text_chars: int = PDF_MAX_TEXT_CHARS


@dataclass(frozen=True, slots=True)
class IngestResult:
    """What `ingest` wrote: the sources (file paths) and the number of chunks."""

    sources: tuple[str, ...]
    chunks: int


def chunk_words(text: str, size: int = CHUNK_WORDS, overlap: int = CHUNK_OVERLAP) -> list[str]:
    """Split text into windows of `size` words, each sharing `overlap` words with the previous one.

    Whitespace is normalised to single spaces. A text of at most `size` words is one chunk.
    """
    if not 0 <= overlap < size:
        raise ValueError("need 0 <= overlap < size")
    words = text.split()
    if not words:
        return []
    step = size - overlap
    chunks = []
    for start in range(0, len(words), step):
        chunks.append(" ".join(words[start : start + size]))
        if start + size >= len(words):
            break
    return chunks


def load_documents(path: Path, limits: IngestLimits | None = None) -> list[Document]:
    """Read a file, or every supported file under a folder, into chunks ready for `DocIndex.add_documents`.

    In a folder, hidden entries and files of other types are skipped; a supported file that is empty, binary or
    malformed fails the whole call. Nothing is written here.

    Raises:
        IngestError: the path is missing, unreadable, empty, binary, of an unsupported type or malformed.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise IngestError(f"{path}: no such file or folder")
    if path.is_dir():
        files = _files_under(path)
        if not files:
            kinds = ", ".join(sorted(SUPPORTED_SUFFIXES))
            raise IngestError(f"{path}: the folder contains no supported files ({kinds})")
        return [doc for file in files for doc in _load_file(file, limits or IngestLimits())]
    return _load_file(path, limits or IngestLimits())


def _files_under(folder: Path) -> list[Path]:
    try:
        found = sorted(folder.rglob("*"))
    except OSError as exc:
        raise IngestError(f"{folder}: cannot list the folder ({exc.strerror or exc})") from exc
    return [
        p
        for p in found
        if p.is_file()
        and p.suffix.lower() in SUPPORTED_SUFFIXES
        and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    ]


def _load_file(path: Path, limits: IngestLimits) -> list[Document]:
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        kinds = ", ".join(sorted(SUPPORTED_SUFFIXES))
        raise IngestError(f"{path}: unsupported file type {suffix or '(none)'!r}; supported: {kinds}")
    if not path.is_file():
        raise IngestError(f"{path}: not a regular file")
    data = _read_bytes(path, min(limits.max_file_bytes, limits.pdf_max_bytes) if suffix == ".pdf"
                       else limits.max_file_bytes)
    source = str(path.resolve())
    if suffix == ".pdf":
        title, text = _pdf_text(path, data, limits)
        return _chunks(source, title, text, path)
    if suffix == ".jsonl":
        return _jsonl_documents(path, source, _decode(path, data))
    if suffix in HTML_SUFFIXES:
        title, text = _html_text(path, data)
        return _chunks(source, title, text, path)
    text = _decode(path, data)
    title = _markdown_title(text) if suffix in MARKDOWN_SUFFIXES else ""
    return _chunks(source, title or path.stem, text, path)


def _read_bytes(path: Path, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise IngestError(f"{path}: file is too large ({size:,} bytes; limit {max_bytes:,}): split it into "
                              "smaller files")
        data = path.read_bytes()
    except PermissionError as exc:
        raise IngestError(f"{path}: cannot read the file (permission denied)") from exc
    except OSError as exc:
        raise IngestError(f"{path}: cannot read the file ({exc.strerror or exc})") from exc
    if not data.strip():
        raise IngestError(f"{path}: the file is empty")
    return data


def _decode(path: Path, data: bytes) -> str:
    # A NUL byte never occurs in real UTF-8 text but is everywhere in images, archives and executables.
    if b"\x00" in data[:65536]:
        raise IngestError(f"{path}: the file looks binary, not text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise IngestError(f"{path}: the file is not UTF-8 text (bad byte at offset {exc.start})") from exc


def _markdown_title(text: str) -> str:
    for line in text.splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return ""


def _html_text(path: Path, data: bytes) -> tuple[str, str]:
    import trafilatura  # lazy: lxml and friends are only needed when HTML is ingested

    if b"\x00" in data[:65536]:
        raise IngestError(f"{path}: the file looks binary, not HTML")
    html = data  # bytes: trafilatura detects the page's declared or sniffed encoding itself
    text = trafilatura.extract(html, include_comments=False, include_tables=True, favor_recall=True)
    if not text or not text.strip():
        text = trafilatura.html2txt(html)  # pages too small for main-text detection: take all visible text
    if not text or not text.strip():
        raise IngestError(f"{path}: no readable text found in the HTML")
    meta = trafilatura.extract_metadata(html)
    return (meta.title if meta is not None and meta.title else path.stem), text


def _pdf_text(path: Path, data: bytes, limits: IngestLimits | None = None) -> tuple[str, str]:
    limits = limits or IngestLimits()
    import io

    import pypdf
    import pypdf.errors

    if not data.lstrip().startswith(b"%PDF-"):
        raise IngestError(f"{path}: not a PDF file (no %PDF header)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pypdf warns about every recoverable quirk of real-world files
            reader = pypdf.PdfReader(io.BytesIO(data))
            if reader.is_encrypted and not reader.decrypt(""):
                raise IngestError(f"{path}: the PDF is encrypted")
            n_pages = len(reader.pages)  # from the page tree, before any page's content is decompressed
            if n_pages > limits.pdf_max_pages:
                raise IngestError(f"{path}: the PDF has {n_pages:,} pages; the limit is {limits.pdf_max_pages:,}: "
                                  "split it into smaller files")
            pages, chars, content = [], 0, 0
            bomb = IngestError(f"{path}: the PDF holds more than {limits.pdf_max_text_chars:,} characters of text (a "
                               "compressed PDF bomb, or simply too long): split it into smaller files")
            for page in reader.pages:
                # A few compressed kilobytes can expand to gigabytes, and extracting text is far slower than
                # decompressing: a page's drawing operators are measured first (text is a part of them).
                stream = page.get_contents()
                content += len(stream.get_data()) if stream is not None else 0
                if content > _CONTENT_PER_CHAR * limits.pdf_max_text_chars:
                    raise bomb
                pages.append(page.extract_text() or "")
                chars += len(pages[-1])
                if chars > limits.pdf_max_text_chars:
                    raise bomb
            title = str(reader.metadata.title) if reader.metadata and reader.metadata.title else ""
    except IngestError:
        raise
    except pypdf.errors.LimitReachedError as exc:  # pypdf's own guards against decompression and array bombs
        raise IngestError(f"{path}: the PDF is over the reader's safety limits (a PDF bomb?): {exc}") from exc
    except Exception as exc:
        raise IngestError(f"{path}: the PDF could not be read ({type(exc).__name__})") from exc
    text = "\n\n".join(p for p in pages if p.strip())
    if not text.strip():
        raise IngestError(f"{path}: the PDF has no extractable text (a scanned image?)")
    return title or path.stem, text


def _jsonl_documents(path: Path, source: str, text: str) -> list[Document]:
    docs: list[Document] = []
    for lineno, line in enumerate(text.split("\n"), start=1):  # not splitlines(): U+2028 may sit inside a string
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise IngestError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
        record = _jsonl_record(path, lineno, obj)
        for piece in chunk_words(record["text"]):
            docs.append(
                Document(
                    source=source,
                    chunk=len(docs),
                    text=piece,
                    title=record["title"],
                    url=record["url"],
                    doc_id=record["id"],
                )
            )
    if not docs:
        raise IngestError(f"{path}: the file has no records")
    return docs


def _jsonl_record(path: Path, lineno: int, obj: Any) -> dict[str, str]:
    where = f"{path}:{lineno}"
    if not isinstance(obj, dict):
        raise IngestError(f'{where}: each line must be a JSON object with a "text" field')
    text = obj.get("text")
    if not isinstance(text, str) or not text.strip():
        raise IngestError(f'{where}: "text" must be a non-empty string')
    out = {"text": text, "title": "", "url": "", "id": ""}
    for key in ("title", "url", "id"):
        value = obj.get(key)
        if value is None:
            continue
        if key == "id" and isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str):
            raise IngestError(f'{where}: "{key}" must be a string')
        out[key] = value
    return out


def _chunks(source: str, title: str, text: str, path: Path) -> list[Document]:
    pieces = chunk_words(text)
    if not pieces:
        raise IngestError(f"{path}: the file has no text")
    return [Document(source=source, chunk=i, text=p, title=title) for i, p in enumerate(pieces)]


def ingest(path: Path, index: DocIndex, progress: ProgressFn | None = None,
           limits: IngestLimits | None = None) -> IngestResult:
    """Read `path` (file or folder) and index it; re-ingesting a file replaces its earlier chunks.

    Raises:
        IngestError: a file is unusable; raised before anything is written, so the index is unchanged.
        store.doc_index.DocIndexError: the index failed while writing (the file being written was rolled back).
    """
    docs = load_documents(path, limits)
    written = index.add_documents(docs, progress=progress)
    sources = tuple(dict.fromkeys(d.source for d in docs))
    return IngestResult(sources=sources, chunks=written)


# ---- bundled demo corpus ---------------------------------------------------------------------------------------


def load_demo_corpus(files: Sequence[str] = DEMO_CORPUS_FILES) -> list[Document]:
    """The bundled Wikipedia passages, one chunk each (title + text; passages are already short)."""
    docs: list[Document] = []
    for name in files:
        docs.extend(_demo_documents(name))
    return docs


def _demo_documents(name: str) -> list[Document]:
    path = DEMO_CORPUS_DIR / name
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise IngestError(f"{path}: the bundled demo corpus is missing or damaged ({exc})") from exc
    if isinstance(raw, dict):  # HotpotQA: title -> sentences (each after the first starts with a space)
        pairs = [(str(title), "".join(sentences).strip()) for title, sentences in raw.items()]
    else:
        pairs = [(str(item.get("title", "")), str(item.get("text", "")).strip()) for item in raw]
    source = DEMO_SOURCE_PREFIX + name
    return [
        Document(source=source, chunk=i, text=text, title=title)
        for i, (title, text) in enumerate(p for p in pairs if p[1])
    ]


def ensure_demo_corpus(index: DocIndex, progress: ProgressFn | None = None) -> int:
    """Index the bundled demo corpus unless it is already complete; returns the number of chunks written.

    A corpus file whose chunk count in the index differs from the file (e.g. a killed first run) is re-indexed.
    With the default embedding model, the precomputed vectors shipped next to the corpus (if present and made
    from these exact files and model) are used, which turns minutes of embedding into seconds.
    """
    missing = [
        (name, docs)
        for name in DEMO_CORPUS_FILES
        if index.source_count(DEMO_SOURCE_PREFIX + name) != len(docs := _demo_documents(name))
    ]
    if not missing:
        return 0
    docs = [d for _, file_docs in missing for d in file_docs]
    vectors = _demo_vectors([name for name, _ in missing]) if index.embedding_model == "" else None
    return index.add_documents(docs, progress=progress, embeddings=vectors)


# Precomputed MiniLM vectors of the demo corpus: float16, one array per corpus file, in `_demo_documents` order.
DEMO_VECTORS = DEMO_CORPUS_DIR / "minilm_vectors.npz"
DEMO_VECTORS_MANIFEST = DEMO_CORPUS_DIR / "minilm_vectors.json"


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _demo_manifest(names: Sequence[str]) -> dict[str, Any]:
    from store.embeddings import bundled_model_path

    return {
        "model_sha256": _sha256_file(bundled_model_path() / "model.safetensors"),
        "text": "title + newline + text (store.doc_index.search_text)",
        "files": {name: _sha256_file(DEMO_CORPUS_DIR / name) for name in names},
    }


def _demo_vectors(names: Sequence[str]) -> list[Any] | None:
    """Shipped vectors for these corpus files, or None when absent or made from other files or another model."""
    import numpy as np

    if not (DEMO_VECTORS.is_file() and DEMO_VECTORS_MANIFEST.is_file()):
        return None
    try:
        manifest = json.loads(DEMO_VECTORS_MANIFEST.read_text(encoding="utf-8"))
        expected = _demo_manifest(names)
        if manifest.get("model_sha256") != expected["model_sha256"]:
            return None
        if any(manifest.get("files", {}).get(n) != expected["files"][n] for n in names):
            return None
        with np.load(DEMO_VECTORS) as arrays:
            vectors = [row for name in names for row in arrays[name].astype(np.float32)]  # (n_file, dim) each
    except (OSError, ValueError, KeyError):
        return None  # a damaged or partial file: embed from scratch instead
    return vectors


def build_demo_vectors(progress: ProgressFn | None = None) -> Path:
    """(Re)compute the shipped demo-corpus vectors with the bundled MiniLM (a few minutes on 2 cores).

    Writes `minilm_vectors.npz` and its manifest next to the corpus; returns the npz path.
    """
    import numpy as np

    from store.doc_index import search_text
    from store.embeddings import embed_texts

    arrays: dict[str, Any] = {}
    all_docs = {name: _demo_documents(name) for name in DEMO_CORPUS_FILES}
    total = sum(len(d) for d in all_docs.values())
    done = 0
    for name, docs in all_docs.items():
        rows = []
        for start in range(0, len(docs), 256):
            batch = docs[start : start + 256]
            rows.extend(embed_texts([search_text(d.title, d.text) for d in batch]))
            done += len(batch)
            if progress is not None:
                progress(done, total)
        arrays[name] = np.stack(rows).astype(np.float16)  # (n, 384); float16 halves the file, ranking unchanged
    with open(DEMO_VECTORS, "wb") as fh:
        np.savez(fh, **arrays)
    manifest = _demo_manifest(DEMO_CORPUS_FILES) | {"count": total, "dtype": "float16"}
    DEMO_VECTORS_MANIFEST.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return DEMO_VECTORS
