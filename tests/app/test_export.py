"""Report export: a stored session becomes Markdown, a standalone HTML page (parsed back) and a PDF (read back with
pypdf); model output is untrusted, so raw HTML is escaped and only web URLs become links."""

from __future__ import annotations

import io
from dataclasses import replace
import os
from html.parser import HTMLParser
from pathlib import Path

import pypdf
import pytest

from app.export import (
    ExportDoc,
    ExportError,
    PdfFonts,
    doc_from_session,
    find_pdf_fonts,
    to_html,
    to_markdown,
    to_pdf,
)
from store.records import Snippet, Trajectory
from store.session_log import SessionLog
from tests.judge.builders import QUESTION, store_session, trajectory

HOSTILE = (
    "Zürich — 東京 was **central** [1][2], unlike [3] and `code [1]`.\n\n"
    "<script>alert('x')</script>\n\n"
    "<img src=x onerror=alert(1)> and [click](javascript:alert(1)) and [ok](https://example.org/ok).\n\n"
    "![tracker](https://tracker.example/pixel.png)\n\n"
    "- item one\n  1. nested [2]\n\n> quoted\n\n```\npre 東京 ü\n```\n\n| a | b |\n|---|---|\n\n"
    + "unbroken" * 60
)
REFS = (
    Snippet(id="abcd0001-0", tool="searxng", title="Zürich — 東京 <b>atlas</b>", text="The snippet text <i>here</i>.",
            url="https://example.com/atlas?a=1&b=2"),
    Snippet(id="abcd0002-1", tool="local_search", title="Local chronicle", text="Haymo died in 1244.", url=""),
)


def doc(body: str = HOSTILE, refs: tuple[Snippet, ...] = REFS, title: str = "Where is Zürich — 東京?") -> ExportDoc:
    return ExportDoc(title=title, body_markdown=body, references=refs, session_id="sess-1", policy_version="policy@3",
                     created_at="2025-01-02T03:04:05.000000+00:00")


def store(log: SessionLog, t: Trajectory, status: str = "completed", report: str | None = "auto") -> str:
    return store_session(log, t, status, report)


class Parsed(HTMLParser):
    """Every start tag with its attributes, and the visible text."""

    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.feed(page)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def all(self, tag: str) -> list[dict[str, str | None]]:
        return [a for t, a in self.tags if t == tag]


def pdf_text(data: bytes) -> str:
    reader = pypdf.PdfReader(io.BytesIO(data))
    return "\n".join(page.extract_text() for page in reader.pages)


# --- from a stored session ------------------------------------------------------------------------------------


def test_doc_from_a_completed_session_has_numbered_references(tmp_path: Path) -> None:
    with SessionLog(tmp_path / "rubricem.sqlite3") as log:
        sid = store(log, trajectory("s1", answer='Books were translated into <cite id="abcd0001-0">Latin</cite>.'))
        record = log.get(sid)
    d = doc_from_session(record)
    assert (d.title, d.session_id, d.policy_version, d.created_at) == (QUESTION, sid, "policy@2", record.created_at)
    assert d.body_markdown == "Books were translated into Latin [1]."
    assert [s.id for s in d.references] == ["abcd0001-0"] and d.consulted == ()
    assert d.references[0] == record.trajectory.snippets["abcd0001-0"]
    # The same numbering as the report stored with the session.
    assert d.body_markdown in (record.report or "")
    page = Parsed(to_html(d))
    assert {"href": "#ref-1", "class": "cite"} in page.all("a") and {"id": "ref-1"} in page.all("li")


def test_an_uncited_answer_lists_the_sources_consulted(tmp_path: Path) -> None:
    with SessionLog(tmp_path / "rubricem.sqlite3") as log:
        record = log.get(store(log, trajectory("s1", answer="Latin, I think.")))
    d = doc_from_session(record)
    assert d.references == () and [s.id for s in d.consulted] == ["abcd0001-0"]
    assert "## Sources consulted (not cited in the text)" in to_markdown(d)
    assert "Sources consulted" in pdf_text(to_pdf(d))


@pytest.mark.parametrize(("status", "report", "message"), [
    ("failed", None, "'failed'; only completed sessions"),
    ("running", None, "'running'; only completed sessions"),
    ("completed", None, "has no stored report"),
])  # fmt: skip
def test_sessions_without_a_report_cannot_be_exported(
    tmp_path: Path, status: str, report: str | None, message: str
) -> None:
    with SessionLog(tmp_path / "rubricem.sqlite3") as log:
        record = log.get(store(log, trajectory("s1"), status=status, report=report))
    with pytest.raises(ExportError, match=message) as caught:
        doc_from_session(record)
    assert isinstance(caught.value, ValueError)


# --- Markdown ---------------------------------------------------------------------------------------------------


def test_markdown_has_question_answer_and_references() -> None:
    md = to_markdown(doc())
    assert md.startswith("# Where is Zürich — 東京?\n")
    assert "_Session sess-1 · policy policy@3 · 2025-01-02T03:04:05.000000+00:00_" in md
    assert HOSTILE.strip() in md
    assert "1. **Zürich — 東京 <b>atlas</b>** — <https://example.com/atlas?a=1&b=2> (document `abcd0001-0`, searxng)" in md
    assert "2. **Local chronicle** (document `abcd0002-1`, local_search)" in md
    assert "   > Haymo died in 1244." in md


# --- HTML -------------------------------------------------------------------------------------------------------


def test_html_is_a_standalone_page_with_citation_links_and_anchors() -> None:
    page_text = to_html(doc())
    assert page_text.startswith("<!DOCTYPE html>")
    page = Parsed(page_text)
    assert [t for t, _ in page.tags][:2] == ["html", "head"]
    assert {"charset": "utf-8"} in page.all("meta")
    csp = [m for m in page.all("meta") if m.get("http-equiv") == "Content-Security-Policy"]
    assert csp and "default-src 'none'" in (csp[0]["content"] or "")
    anchors = [a for a in page.all("a") if a.get("class") == "cite"]
    assert [a["href"] for a in anchors] == ["#ref-1", "#ref-2", "#ref-2"]  # [3] has no reference: stays text
    assert [li["id"] for li in page.all("li") if li.get("id")] == ["ref-1", "ref-2"]
    text = "".join(page.text)
    assert "unlike [3] and code [1]." in text  # a marker in a code span is not a link
    assert "Where is Zürich — 東京?" in text and "The snippet text <i>here</i>." in text


def test_html_escapes_the_model_output_instead_of_rendering_it() -> None:
    page_text = to_html(doc())
    page = Parsed(page_text)
    tags = {t for t, _ in page.tags}
    assert "script" not in tags and "img" not in tags  # raw HTML and images are never rendered
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page_text or "&lt;script&gt;" in page_text
    text = "".join(page.text)
    assert "<script>alert('x')</script>" in text and "<img src=x onerror=alert(1)>" in text
    assert "Zürich — 東京 <b>atlas</b>" in text  # a tool's title is text too
    hrefs = [a.get("href") or "" for a in page.all("a")]
    assert not any(h.lower().startswith("javascript:") for h in hrefs)
    assert "https://tracker.example/pixel.png" not in [a.get("src") for _, a in page.tags]
    external = [a for a in page.all("a") if (a.get("href") or "").startswith("http")]
    # Links the model wrote are text (issue 65); only the reference's URL, from the retrieved source, is a link.
    assert {a["href"] for a in external} == {"https://example.com/atlas?a=1&b=2"}
    assert all(a.get("rel") == "nofollow noopener noreferrer" for a in external)
    assert "ok (https://example.org/ok)" in text and "!tracker (https://tracker.example/pixel.png)" in text


def test_only_web_urls_become_links_in_references() -> None:
    refs = (
        Snippet(id="x-0", tool="browse", title="Evil", text="t", url="javascript:alert(1)"),
        Snippet(id="x-1", tool="local_search", title="File", text="t", url="/srv/corpus/chronicle.txt"),
        Snippet(id="x-2", tool="searxng", title="Web", text="t", url="http://example.net/page"),
        Snippet(id="x-3", tool="browse", title="Breaker", text="t", url='https://e.com/"><script>x</script>'),
    )
    page = Parsed(to_html(doc("A [1] B [2] C [3]", refs)))
    assert "script" not in {t for t, _ in page.tags}
    assert "<https://e.com/" not in to_markdown(doc("A [1]", refs))  # no autolink a URL could break out of
    assert [a["href"] for a in page.all("a") if a.get("class") != "cite"] == ["http://example.net/page"]
    text = "".join(page.text)
    assert "javascript:alert(1)" in text and "/srv/corpus/chronicle.txt" in text  # shown, not linked
    assert "document x-1" in text


# --- PDF --------------------------------------------------------------------------------------------------------


def test_pdf_contains_question_answer_and_references() -> None:
    data = to_pdf(doc(body="Books were translated into **Latin** [1].", title="In which language?"))
    assert data.startswith(b"%PDF")
    text = pdf_text(data)
    assert "In which language?" in text and "Books were translated into Latin [1]." in text
    assert "Zürich" in text and "atlas" in text and "Local chronicle" in text
    assert "https://example.com/atlas?a=1&b=2" in text and "Haymo died in 1244." in text
    annots = pypdf.PdfReader(io.BytesIO(data)).pages[0].get("/Annots")
    links = [a.get_object()["/A"]["/URI"] for a in annots or []]  # type: ignore[union-attr]
    assert "https://example.com/atlas?a=1&b=2" in links


def test_pdf_with_hostile_non_latin_markdown_does_not_crash() -> None:
    data = to_pdf(doc())
    text = pdf_text(data)
    assert data.startswith(b"%PDF") and "Where is Zürich" in text and "<script>alert('x')</script>" in text
    assert "!tracker" in text and "unbrokenunbroken" in text  # the image became a plain link: nothing was fetched


def test_pdf_without_a_unicode_font_replaces_what_latin1_cannot_show() -> None:
    data = to_pdf(doc(), fonts=None)
    text = pdf_text(data)
    assert "Where is Zürich - ??" in text  # em dash to "-", CJK to "?"
    assert "Local chronicle" in text


DEJAVU = find_pdf_fonts()


@pytest.mark.skipif(DEJAVU is None, reason="no DejaVu Sans on this machine (Debian: fonts-dejavu-core)")
def test_pdf_with_dejavu_keeps_non_latin1_text(tmp_path: Path) -> None:
    assert DEJAVU is not None
    text = pdf_text(to_pdf(doc(), fonts=DEJAVU))
    assert "Where is Zürich — " in text  # the em dash survives; CJK does unless a CJK fallback font is installed
    if not DEJAVU.fallbacks:
        assert "Zürich — ??" in text
    # Only the regular face installed: every style falls back to it.
    regular = dict(DEJAVU.styles)[""]
    os.symlink(regular, tmp_path / regular.name)
    only = find_pdf_fonts([tmp_path])
    assert only == PdfFonts(styles=(("", tmp_path / regular.name), ("B", tmp_path / regular.name),
                                    ("I", tmp_path / regular.name), ("BI", tmp_path / regular.name)))
    assert "central" in pdf_text(to_pdf(doc(), fonts=only))


LIBERATION = Path("/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf")


@pytest.mark.skipif(DEJAVU is None or not LIBERATION.is_file(), reason="needs DejaVu Sans and Liberation Sans")
def test_fallback_fonts_fill_in_glyphs_the_main_font_lacks() -> None:
    assert DEJAVU is not None
    snowman = doc(body="Snow ☃ and ∀x [1]", title="Snow ☃ man")  # Liberation has neither glyph; DejaVu has both
    alone = pdf_text(to_pdf(snowman, fonts=PdfFonts(styles=(("", LIBERATION),))))
    assert "Snow ? man" in alone and "Snow ? and ?x [1]" in alone
    helped = pdf_text(to_pdf(snowman, fonts=PdfFonts(styles=(("", LIBERATION),), fallbacks=(dict(DEJAVU.styles)[""],))))
    assert "Snow ☃ man" in helped and "Snow ☃ and ∀x [1]" in helped
    with pytest.raises(ValueError, match="regular face"):
        to_pdf(snowman, fonts=PdfFonts(styles=(("B", LIBERATION),)))


def test_no_fonts_found_means_the_core_font_fallback(tmp_path: Path) -> None:
    assert find_pdf_fonts([tmp_path, tmp_path / "missing"]) is None
    with pytest.raises(ValueError, match="fonts must be"):
        to_pdf(doc(), fonts="dejavu")  # type: ignore[arg-type]


def test_answers_fpdf2_cannot_lay_out_still_reach_the_pdf_whole() -> None:
    deep = "Intro [1]\n\n" + "\n".join("  " * i + f"- level {i}" for i in range(40)) + "\n\n" + "> " * 60 + "deepest-quote"
    text = pdf_text(to_pdf(doc(body=deep + "\n\nbell \x07 nul \x00 done")))
    assert all(f"level {i}" in text for i in range(40)) and "deepest-quote" in text  # printed as its Markdown text
    assert "bell nul done" in text  # control characters dropped, not turned into boxes
    page = "".join(Parsed(to_html(doc(body=deep))).text)  # markdown-it's default nesting cap (20) would drop these
    assert all(f"level {i}" in page for i in range(40)) and "deepest-quote" in page


def test_every_format_lists_the_citation_check_with_the_sentences_escaped() -> None:
    """Issue 48: the exports carry each checked claim (status, support, sentence); a claim is the model's text."""
    from agent.support import ClaimSupport, SupportCheck

    check = SupportCheck((ClaimSupport("Haymo died in 1244.", ("abcd0002-1",), ("abcd0002-1",), 0.81, "supported"),
                          ClaimSupport("<b>Bold</b> claim <script>x</script>", ("abcd0001-0",), (), 0.12,
                                       "unsupported")))
    d = replace(doc(body="Haymo died in 1244 [1]. <b>Bold</b> claim *(unsupported)*.", refs=REFS[1:]), support=check)
    md = to_markdown(d)
    assert "## Citation check" in md and "- supported (0.81): Haymo died in 1244." in md
    assert r"- unsupported (0.12): \<b\>Bold\</b\> claim" in md  # the claim is escaped in Markdown (issue 64)
    page = to_html(d)
    assert "<script>x</script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
    assert 'id="citation-check"' in page and "unsupported (0.12)" in "".join(Parsed(page).text)
    text = pdf_text(to_pdf(d))
    assert "Citation check" in text and "supported (0.81): Haymo died in 1244." in text
    unverified = replace(d, support=SupportCheck((), verified=False, note="the support scorer is unavailable"))
    assert "Not verified: the support scorer is unavailable." in to_markdown(unverified)
    assert "Citation check" not in to_markdown(replace(d, support=None))  # a session from before the check
