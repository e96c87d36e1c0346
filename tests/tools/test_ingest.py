"""Ingest: each file format, chunking, typed errors before any write, re-ingest idempotency, demo corpus loader."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tools_support import assemble_pdf, make_pdf

from agent.errors import IngestError
from agent.ingest import (
    CHUNK_OVERLAP,
    CHUNK_WORDS,
    DEMO_CORPUS_FILES,
    chunk_words,
    ingest,
    load_demo_corpus,
    load_documents,
)
from store.doc_index import DocIndex, chunk_id

HTML = """<html><head><title>Okapi notes</title></head><body><nav>Home | Blog | Shop</nav>
<main><h1>The okapi</h1><p>The okapi is a giraffid artiodactyl mammal native to the northeast of the Democratic
Republic of the Congo in central Africa. Although the okapi has striped markings reminiscent of zebras, it is most
closely related to the giraffe.</p></main></body></html>"""


def write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data, encoding="utf-8")
    return path


# ---- chunking ---------------------------------------------------------------------------------------------------


def test_chunk_words_windows_overlap() -> None:
    words = [f"w{i}" for i in range(500)]
    chunks = chunk_words(" ".join(words))
    assert [len(c.split()) for c in chunks] == [CHUNK_WORDS, CHUNK_WORDS, 500 - 2 * (CHUNK_WORDS - CHUNK_OVERLAP)]
    step = CHUNK_WORDS - CHUNK_OVERLAP
    assert chunks[1].split()[0] == f"w{step}"
    assert chunks[0].split()[-CHUNK_OVERLAP:] == chunks[1].split()[:CHUNK_OVERLAP]
    assert chunks[-1].split()[-1] == "w499"


def test_chunk_words_short_and_empty() -> None:
    assert chunk_words("one  two\n\nthree") == ["one two three"]
    assert chunk_words("   \n") == []
    assert len(chunk_words(" ".join(["x"] * CHUNK_WORDS))) == 1
    with pytest.raises(ValueError):
        chunk_words("a", size=10, overlap=10)


# ---- formats ----------------------------------------------------------------------------------------------------


def test_txt_and_md(tmp_path: Path) -> None:
    txt = write(tmp_path / "notes.txt", "Plain notes about the okapi.\n")
    [doc] = load_documents(txt)
    assert doc.title == "notes" and doc.text == "Plain notes about the okapi." and doc.chunk == 0
    assert doc.source == str(txt.resolve()) and doc.id == chunk_id(doc.source, 0)
    md = write(tmp_path / "guide.md", "Intro line\n# Okapi Guide\n\nSome *markdown* text.\n")
    [doc] = load_documents(md)
    assert doc.title == "Okapi Guide" and "markdown" in doc.text


def test_utf8_bom_is_accepted(tmp_path: Path) -> None:
    [doc] = load_documents(write(tmp_path / "bom.txt", "Café crème".encode("utf-8-sig")))
    assert doc.text == "Café crème"


def test_html_main_text(tmp_path: Path) -> None:
    [doc] = load_documents(write(tmp_path / "okapi.html", HTML))
    assert "most closely related to the giraffe" in doc.text
    assert "Shop" not in doc.text
    assert doc.title in {"Okapi notes", "The okapi"}


def test_html_in_another_encoding(tmp_path: Path) -> None:
    page = (
        '<html><head><meta charset="iso-8859-1"><title>Caf\xe9</title></head>'
        "<body><p>Caf\xe9 au lait.</p></body></html>"
    )
    [doc] = load_documents(write(tmp_path / "latin.htm", page.encode("latin-1")))
    assert "Café au lait" in doc.text


def test_pdf(tmp_path: Path) -> None:
    pdf = write(
        tmp_path / "paper.pdf", make_pdf(["Okapis live in the Ituri rainforest.", "Page text (two)."], "Okapi Paper")
    )
    [doc] = load_documents(pdf)
    assert doc.title == "Okapi Paper"
    assert "Ituri rainforest" in doc.text and "(two)" in doc.text


def test_jsonl(tmp_path: Path) -> None:
    rows = [
        {"text": "First record about okapis.", "title": "Rec 1", "url": "https://a.example/1", "id": "r1"},
        {"text": "Second record.", "id": 2},
        {"text": " ".join(["long"] * (CHUNK_WORDS + 50)), "title": "Long"},
    ]
    path = write(tmp_path / "data.jsonl", "\n".join(json.dumps(r) for r in rows[:2]) + "\n\n" + json.dumps(rows[2]))
    docs = load_documents(path)
    assert [d.chunk for d in docs] == [0, 1, 2, 3]
    assert (docs[0].title, docs[0].url, docs[0].doc_id) == ("Rec 1", "https://a.example/1", "r1")
    assert docs[1].doc_id == "2" and docs[1].title == ""
    assert docs[2].title == docs[3].title == "Long"


def test_folder_recursive_skips_hidden_and_unsupported(tmp_path: Path) -> None:
    write(tmp_path / "a.txt", "alpha text")
    write(tmp_path / "sub" / "deeper" / "b.md", "# B\nbeta text")
    write(tmp_path / "sub" / "c.html", HTML)
    write(tmp_path / "image.png", b"\x89PNG\r\n\x1a\n\x00\x00")
    write(tmp_path / ".git" / "config.txt", "hidden")
    write(tmp_path / ".secret.txt", "hidden too")
    docs = load_documents(tmp_path)
    names = sorted(Path(d.source).name for d in docs)
    assert names == ["a.txt", "b.md", "c.html"]


# ---- bad input: typed errors, nothing written ---------------------------------------------------------------------


def _bad_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    broken = tmp_path / "broken.txt"
    broken.symlink_to(tmp_path / "gone.txt")
    return {
        "missing": (tmp_path / "nope.txt", "no such file"),
        "broken symlink": (broken, "no such file"),
        "empty": (write(tmp_path / "empty.txt", ""), "empty"),
        "blank": (write(tmp_path / "blank.md", "  \n\t\n"), "empty"),
        "binary": (write(tmp_path / "photo.txt", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"), "binary"),
        "not utf-8": (write(tmp_path / "latin.txt", "caf\xe9".encode("latin-1")), "not UTF-8"),
        "unsupported": (write(tmp_path / "report.docx", b"PK\x03\x04"), "unsupported file type"),
        "no suffix": (write(tmp_path / "README", "text"), "unsupported file type"),
        "fifo": (fifo, "not a regular file"),
        "folder with nothing": (tmp_path / "emptydir", "no supported files"),
        "jsonl bad json": (write(tmp_path / "a.jsonl", '{"text": "ok"}\n{"text": \n'), ":2: not valid JSON"),
        "jsonl no text": (write(tmp_path / "b.jsonl", '{"title": "t"}\n'), '"text" must be'),
        "jsonl not object": (write(tmp_path / "c.jsonl", '["text"]\n'), "JSON object"),
        "jsonl bad title": (write(tmp_path / "d.jsonl", '{"text": "x", "title": 5}\n'), '"title" must be'),
        "pdf garbage": (write(tmp_path / "e.pdf", b"%PDF-1.4\nthis is not really a pdf"), "could not be read"),
        "pdf not pdf": (write(tmp_path / "f.pdf", b"hello, I am text"), "not a PDF"),
        "pdf no text": (write(tmp_path / "g.pdf", make_pdf([])), "no extractable text"),
        "html empty": (write(tmp_path / "h.html", "<html><body>  </body></html>"), "no readable text"),
        "html binary": (write(tmp_path / "i.html", b"<html>\x00\x01\x02</html>"), "binary"),
    }


def test_bad_files_raise_ingest_error_and_leave_index_unchanged(tmp_path: Path, index: DocIndex) -> None:
    (tmp_path / "emptydir").mkdir()
    good = write(tmp_path / "good.txt", "Okapis are shy.")
    ingest(good, index)
    before = index.count()
    for label, (path, message) in _bad_files(tmp_path).items():
        with pytest.raises(IngestError, match=message):
            ingest(path, index)
        assert index.count() == before, label
    assert index.sources() == {str(good.resolve())}


def test_one_bad_file_in_a_folder_writes_nothing(tmp_path: Path, index: DocIndex) -> None:
    folder = tmp_path / "docs"
    write(folder / "a.txt", "A good file about okapis.")
    write(folder / "b.jsonl", '{"text": "fine"}\nnot json\n')
    with pytest.raises(IngestError, match="b.jsonl:2"):
        ingest(folder, index)
    assert index.count() == 0
    assert not index.has_source(str((folder / "a.txt").resolve()))


# ---- re-ingest --------------------------------------------------------------------------------------------------


def test_reingest_replaces_instead_of_duplicating(tmp_path: Path, index: DocIndex) -> None:
    path = write(tmp_path / "long.txt", " ".join(f"okapi{i}" for i in range(600)))
    first = ingest(path, index)
    assert first.chunks == 4 and first.sources == (str(path.resolve()),)
    assert index.count() == 4
    ingest(path, index)
    assert index.count() == 4  # same ids: replaced, not duplicated
    write(path, "Now a single short paragraph about okapis.")
    assert ingest(path, index).chunks == 1
    assert index.count() == 1  # the stale chunks 1..3 are gone
    [hit] = index.search("short paragraph okapis", 5)
    assert hit.text == "Now a single short paragraph about okapis."


def test_ingest_reports_progress(tmp_path: Path, index: DocIndex) -> None:
    for i in range(3):
        write(tmp_path / f"f{i}.txt", f"file number {i} about okapis")
    seen: list[tuple[int, int]] = []
    result = ingest(tmp_path, index, progress=lambda done, total: seen.append((done, total)))
    assert result.chunks == 3 and len(result.sources) == 3
    assert seen[-1] == (3, 3) and all(t == 3 for _, t in seen)


# ---- demo corpus ------------------------------------------------------------------------------------------------


def test_demo_corpus_loads_every_passage_as_one_chunk() -> None:
    docs = load_demo_corpus()
    assert len(docs) == 9003
    assert {d.source for d in docs} == {f"demo:{n}" for n in DEMO_CORPUS_FILES}
    assert len({d.id for d in docs}) == 9003
    hotpot = [d for d in docs if d.source == "demo:hotpotqa_train_corpus.json"]
    first = next(d for d in hotpot if d.title == "Demon Dice")
    assert first.text.startswith("Demon Dice, originally published as Chaos Progenitus")
    assert "Tim Brown. In it, each player" in first.text  # sentences joined with their own spacing


def test_demo_corpus_attribution_is_bundled() -> None:
    from agent.ingest import DEMO_CORPUS_DIR

    text = (DEMO_CORPUS_DIR / "ATTRIBUTION.md").read_text(encoding="utf-8")
    for needle in ("CC BY-SA 4.0", "CC BY 4.0", "Apache-2.0", "MIT", "OSU-NLP-Group/HippoRAG"):
        assert needle in text


# ---- caps (issue 34): a small PDF must not cost unbounded pages, text or memory ---------------------------------


def bomb_pdf(pages: int, text: bytes, repeat: int) -> bytes:
    """A hand-built PDF: `pages` page entries (all one page object, so the file stays tiny) whose content stream,
    FlateDecode-compressed, shows `text` `repeat` times: a few kilobytes on disk, as much text as asked."""
    import zlib

    stream = zlib.compress(b"BT /F1 11 Tf 72 740 Td 14 TL\n" + (b"(" + text + b") Tj T*\n") * repeat + b"ET", 9)
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [" + b" ".join([b"3 0 R"] * pages) + b"] /Count %d >>" % pages,
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    return assemble_pdf(objects)


def test_a_pdf_with_more_pages_than_the_cap_is_refused_before_any_text_is_extracted(tmp_path: Path) -> None:
    from agent.ingest import IngestLimits

    path = write(tmp_path / "pages.pdf", bomb_pdf(5_000, b"Okapis live in the Ituri rainforest.", 1))
    assert path.stat().st_size < 100_000
    with pytest.raises(IngestError, match=r"pages.pdf: the PDF has 5,000 pages; the limit is 500: split it"):
        load_documents(path)  # the default cap
    small = write(tmp_path / "few.pdf", bomb_pdf(3, b"Okapis live in the Ituri rainforest.", 1))
    with pytest.raises(IngestError, match="has 3 pages; the limit is 2"):
        load_documents(small, IngestLimits(pdf_max_pages=2))
    assert "Ituri" in load_documents(small, IngestLimits(pdf_max_pages=3))[0].text


def test_a_compressed_pdf_bomb_is_refused_by_its_text_cap(tmp_path: Path) -> None:
    from agent.ingest import IngestLimits

    path = write(tmp_path / "bomb.pdf", bomb_pdf(1, b"okapi " * 100, 40_000))  # 24 MB of text in a few KB
    assert path.stat().st_size < 200_000
    with pytest.raises(IngestError, match="more than 5,000,000 characters of text .*PDF bomb.*split it"):
        load_documents(path)
    with pytest.raises(IngestError, match="more than 1,000 characters"):
        load_documents(write(tmp_path / "b2.pdf", bomb_pdf(1, b"okapi " * 100, 10)),
                       IngestLimits(pdf_max_text_chars=1000))


def test_a_pdf_over_its_size_cap_is_refused_unread(tmp_path: Path) -> None:
    from agent.ingest import IngestLimits

    path = write(tmp_path / "big.pdf", make_pdf(["Okapis live in the Ituri rainforest."], "Okapi"))
    with pytest.raises(IngestError, match=r"big.pdf: file is too large \(\d+ bytes; limit 100\): split it"):
        load_documents(path, IngestLimits(pdf_max_bytes=100))


def test_uploads_are_copied_in_pieces_under_a_size_cap_and_a_pdf_bomb_upload_is_refused_whole(
        tmp_path: Path, index: DocIndex) -> None:
    import io

    from app.settings import UploadsConfig
    from app.uploads import ingest_uploads, upload_limits

    uploads = tmp_path / "uploads"
    limits = upload_limits(UploadsConfig(max_file_bytes=1_000_000))
    before = index.count()
    big = io.BytesIO(b"okapi " * 400_000)  # 2.4 MB, as Streamlit hands it over (a file object, read in pieces)
    with pytest.raises(IngestError, match=r"big.txt: the file is too large \(over the upload limit of 1,000,000 "
                                          r"bytes\): split it"):
        ingest_uploads([("big.txt", big)], uploads, index, limits=limits)
    with pytest.raises(IngestError, match=r"raw.txt: the file is too large \(2,400,000 bytes; the upload limit"):
        ingest_uploads([("raw.txt", b"okapi " * 400_000)], uploads, index, limits=limits)
    bomb = io.BytesIO(bomb_pdf(5_000, b"Okapis live in the Ituri rainforest.", 1))
    with pytest.raises(IngestError, match="the PDF has 5,000 pages; the limit is 500"):
        ingest_uploads([("notes.md", io.BytesIO(b"# Okapi\n\nOkapis eat leaves.\n")), ("bomb.pdf", bomb)], uploads,
                       index, limits=limits)
    assert index.count() == before and not uploads.exists()  # nothing written, nothing kept
    result = ingest_uploads([("notes.md", io.BytesIO(b"# Okapi\n\nOkapis eat leaves.\n"))], uploads, index,
                            limits=limits)
    assert result.files == ("notes.md",) and (uploads / "notes.md").read_bytes() == b"# Okapi\n\nOkapis eat leaves.\n"
