"""Documents added from the UI: every file checked before anything is indexed, then kept under <data>/uploads/.

Plain Python (no Streamlit) so the rules are tested directly. The browser's file names are untrusted: only a safe
base name is kept, and two files that would share one are refused together rather than silently merged.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.errors import IngestError
from agent.ingest import ingest, load_documents
from store.doc_index import DocIndex
from store.errors import StoreError


@dataclass(frozen=True, slots=True)
class UploadResult:
    """What an upload indexed."""

    chunks: int
    files: tuple[str, ...]  # the names kept under uploads/


def safe_name(name: str) -> str:
    """A file name safe to keep: the base name, characters outside [A-Za-z0-9._-] replaced, no leading dots."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", Path(name).name).lstrip(".") or "upload.txt"


def ingest_uploads(files: Sequence[tuple[str, bytes]], uploads: Path, index: DocIndex) -> UploadResult:
    """Check every file, then keep each under `uploads` and index it (re-uploading a name replaces its chunks).

    Raises:
        IngestError: a file cannot be read as a document, or two files share a safe name; nothing was written.
        StoreError: the index failed on a file; the files before it stay indexed and kept, that file is put back
            as it was (its earlier version, or none), and the message names what was indexed.
    """
    names = [safe_name(n) for n, _ in files]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise IngestError(f"several files would be kept as {', '.join(clashes)}: rename them and upload again")
    with tempfile.TemporaryDirectory() as tmp:
        for safe, (_, data) in zip(names, files, strict=True):
            (Path(tmp) / safe).write_bytes(data)
        load_documents(Path(tmp))  # an IngestError here leaves the index and uploads/ untouched
    uploads.mkdir(parents=True, exist_ok=True)
    chunks, done = 0, []
    for safe, (_, data) in zip(names, files, strict=True):
        target = uploads / safe
        previous = target.read_bytes() if target.exists() else None
        target.write_bytes(data)
        try:
            chunks += ingest(target, index).chunks  # chunk ids come from this path: a re-upload replaces them
        except StoreError as exc:
            if previous is None:
                target.unlink(missing_ok=True)
            else:
                target.write_bytes(previous)
            kept = f"; indexed before it: {', '.join(done)}" if done else ""
            raise type(exc)(f"indexing {safe} failed: {exc}{kept}") from exc
        done.append(safe)
    return UploadResult(chunks=chunks, files=tuple(done))
