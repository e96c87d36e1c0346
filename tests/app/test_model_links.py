"""Issue 65, finding 15: SECURITY.md says model and tool output cannot add links to a page. Links the model writes in
its answer (inline, autolinks, reference-style, an image turned link) are shown as plain, escaped text: the chat's
answer panel, the HTML export and the PDF have no anchor or link annotation of theirs. The only links are the ones the
app builds: `[n]` citations to the references, and each reference's web URL, taken from the source a tool retrieved.

Real parts: the session's stored report rendered by the chat's view (`app.ui.view`) and by the exports
(`app.export`), read back with an HTML parser and pypdf.
"""

from __future__ import annotations

import io
from html.parser import HTMLParser

import pypdf

from agent.report import build_report
from app.export import ExportDoc, to_html, to_pdf
from app.ui.view import cited_html
from store.records import Snippet
from tests.judge.builders import trajectory

MODEL_LINKS = (
    "The order followed the Rule [1]. Read [the full story](https://phish.example/login?next=1) or "
    "<https://auto.example/x>, see [the archive][arch], and ![pixel](https://tracker.example/p.png). "
    "Mail <someone@attacker.example>. [A label with [1] inside](http://inner.example/).\n\n"
    "[arch]: https://refdef.example/a \"title\"\n"
)
MODEL_URLS = ("https://phish.example/login?next=1", "https://auto.example/x", "https://refdef.example/a",
              "https://tracker.example/p.png", "someone@attacker.example", "http://inner.example/")
SOURCE = Snippet(id="abcd0001-0", tool="searxng", title="The Rule", text="The Rule of 1223.",
                 url="https://source.example/rule?a=1&b=2")


class Anchors(HTMLParser):
    """Every <a> with its attributes, and the visible text."""

    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.anchors: list[dict[str, str | None]] = []
        self.text: list[str] = []
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.anchors.append(dict(attrs))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _doc() -> ExportDoc:
    return ExportDoc(title="Which rule?", body_markdown=MODEL_LINKS, references=(SOURCE,), session_id="sess-1",
                     policy_version="policy@3", created_at="2025-01-02T03:04:05.000000+00:00")


def _shown_as_text(text: str) -> None:
    """Each URL the model wrote is still there to read, as text."""
    for url in MODEL_URLS:
        assert url in text, url
    assert "the full story (https://phish.example/login?next=1)" in text


def test_the_chat_answer_shows_model_links_as_text_and_keeps_citation_links() -> None:
    """The answer as the model wrote it (a cite tag the report turns into [1]), through the chat's renderer."""
    answer = MODEL_LINKS.replace("the Rule [1]", 'the <cite id="abcd0001-0">Rule</cite>')
    report = build_report(trajectory(answer=answer))
    assert len(report.references) == 1
    page = Anchors(cited_html(report, "s"))
    assert page.anchors == [{"href": "#ref-s-1", "class": "cite"}]  # the citation; the [1] in a link's label is text
    _shown_as_text("".join(page.text))


def test_the_html_export_links_only_citations_and_the_retrieved_sources() -> None:
    page = Anchors(to_html(_doc()))
    hrefs = [a.get("href") for a in page.anchors]
    assert hrefs == ["#ref-1", SOURCE.url], hrefs
    _shown_as_text("".join(page.text))


def test_the_pdf_has_no_link_annotation_the_model_wrote() -> None:
    reader = pypdf.PdfReader(io.BytesIO(to_pdf(_doc())))
    annots = [a.get_object() for p in reader.pages for a in (p.get("/Annots") or [])]  # type: ignore[union-attr]
    uris = [a["/A"].get("/URI") for a in annots if "/A" in a]
    assert [u for u in uris if u] == [SOURCE.url], uris
