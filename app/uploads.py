"""Documents added from the UI: every file checked before anything is indexed, then kept under <data>/uploads/.

Plain Python (no Streamlit) so the rules are tested directly. The browser's file names are untrusted: only a safe
base name is kept, and two files that would share one are refused together rather than silently merged. A file is
copied to disk in pieces, never held whole a second time, and refused once it is over the size cap; PDFs also get
page and text caps (`agent.ingest.IngestLimits`, from the `uploads` settings; issue 34).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from agent.errors import IngestError
from agent.ingest import IngestLimits, ingest, load_documents
from store.doc_index import DocIndex
from store.errors import StoreError

if TYPE_CHECKING:
    from app.settings import UploadsConfig

_PIECE = 1 << 20  # bytes copied at a time


@dataclass(frozen=True, slots=True)
class UploadResult:
    """What an upload indexed."""

    chunks: int
    files: tuple[str, ...]  # the names kept under uploads/


def safe_name(name: str) -> str:
    """A file name safe to keep: the base name, characters outside [A-Za-z0-9._-] replaced, no leading dots."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", Path(name).name).lstrip(".") or "upload.txt"


def upload_limits(cfg: UploadsConfig) -> IngestLimits:
    """The ingest caps for uploads, from the `uploads` settings."""
    return IngestLimits(max_file_bytes=cfg.max_file_bytes, pdf_max_bytes=cfg.pdf_max_bytes,
                        pdf_max_pages=cfg.pdf_max_pages, pdf_max_text_chars=cfg.pdf_max_text_chars)


def _spool(name: str, data: bytes | BinaryIO, target: Path, max_bytes: int) -> None:
    """Copy one upload to `target` piece by piece, refusing it as soon as it is over `max_bytes`."""
    size = len(data) if isinstance(data, bytes | bytearray) else getattr(data, "size", None)
    if isinstance(size, int) and size > max_bytes:
        raise IngestError(f"{name}: the file is too large ({size:,} bytes; the upload limit is {max_bytes:,}): "
                          "split it into smaller files")
    written = 0
    with open(target, "wb") as out:
        if isinstance(data, bytes | bytearray):
            out.write(data)
            return
        data.seek(0)
        while piece := data.read(_PIECE):
            written += len(piece)
            if written > max_bytes:
                raise IngestError(f"{name}: the file is too large (over the upload limit of {max_bytes:,} bytes): "
                                  "split it into smaller files")
            out.write(piece)


def ingest_uploads(files: Sequence[tuple[str, bytes | BinaryIO]], uploads: Path, index: DocIndex,
                   limits: IngestLimits | None = None) -> UploadResult:
    """Check every file, then keep each under `uploads` and index it (re-uploading a name replaces its chunks).

    `files` are (browser name, content): bytes, or a binary file object (Streamlit's UploadedFile), read in pieces.

    Raises:
        IngestError: a file is over a cap (`limits`: size, PDF pages or text), cannot be read as a document, or two
            files share a safe name; nothing was written.
        StoreError: the index failed on a file; the files before it stay indexed and kept, that file is put back
            as it was (its earlier version, or none), and the message names what was indexed.
    """
    names = [safe_name(n) for n, _ in files]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise IngestError(f"several files would be kept as {', '.join(clashes)}: rename them and upload again")
    limits = limits or IngestLimits()
    with tempfile.TemporaryDirectory() as tmp:
        staged, backups = Path(tmp) / "staged", Path(tmp) / "previous"
        staged.mkdir(), backups.mkdir()
        for safe, (name, data) in zip(names, files, strict=True):
            _spool(safe_name(name), data, staged / safe, limits.max_file_bytes)
        load_documents(staged, limits)  # an IngestError here leaves the index and uploads/ untouched
        uploads.mkdir(parents=True, exist_ok=True)
        chunks, done = 0, []
        for safe in names:
            target = uploads / safe
            had = target.exists()
            if had:
                shutil.copyfile(target, backups / safe)
            shutil.copyfile(staged / safe, target)
            try:
                chunks += ingest(target, index, limits=limits).chunks  # ids come from this path: re-uploads replace
            except StoreError as exc:
                if had:
                    shutil.copyfile(backups / safe, target)
                else:
                    target.unlink(missing_ok=True)
                kept = f"; indexed before it: {', '.join(done)}" if done else ""
                raise type(exc)(f"indexing {safe} failed: {exc}{kept}") from exc
            done.append(safe)
    return UploadResult(chunks=chunks, files=tuple(done))
