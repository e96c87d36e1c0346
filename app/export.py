"""Export a stored research report as Markdown, a standalone HTML page or a PDF (markdown-it-py, fpdf2).

The answer is untrusted model output: raw HTML is escaped, images never rendered or fetched, and links the model wrote
shown as plain text (issue 65): the only links are the ones the app builds, `[n]` citations and the references' URLs.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from markdown_it import MarkdownIt
from markdown_it.rules_core import StateCore
from markdown_it.token import Token

from agent.followup import typed_question
from agent.report import MAX_UNCITED_SOURCES, evidence_sentence, invented_sentence, stored_report
from agent.support import STATUS_WORDS, SupportCheck
from store.records import SessionRecord, Snippet

__all__ = [
    "FONT_DIRS",
    "ExportDoc",
    "ExportError",
    "PdfFonts",
    "answer_html",
    "doc_from_session",
    "find_pdf_fonts",
    "to_html",
    "to_markdown",
    "to_pdf",
    "web_url",
]

SNIPPET_CHARS = 1500  # a reference shows at most this much of its snippet (tools already clip; this is a backstop)
_MARKER = re.compile(r"\[(\d{1,4}(?:\s*,\s*\d{1,4})*)\]")  # [3] or [1, 2]
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_URL_BREAKERS = re.compile(r"[\s\x00-\x1f\x7f<>\"'`]")


class ExportError(ValueError):
    """The session cannot be exported (not completed, or it has no report)."""


@dataclass(frozen=True)
class ExportDoc:
    """Everything an export shows, independent of the output format.

    Attributes:
        title: The question.
        body_markdown: The answer as Markdown with `[n]` citation markers.
        references: Cited sources in reference-number order (`[1]` is `references[0]`).
        session_id: The stored session.
        policy_version: The policy that answered, e.g. "policy@3".
        created_at: When the session started (ISO-8601 UTC).
        consulted: When nothing was cited: the sources the answer rests on, shown apart and labelled as not cited
            (as the stored report does). Empty whenever `references` is not.
        attributed: The model cited nothing and the `[n]` markers were matched to passages after writing
            (`agent.report.attribute_report`); the references heading says so.
        support: Each cited sentence checked against its passage (`agent.support`), listed after the references;
            None for a session that was not checked.
        invented_citations: Cited ids no search of the session returned (removed; their claims are marked).
        answer_found: The model wrote an answer (False: the body says it wrote none, and no line says it cites
            nothing).
    """

    title: str
    body_markdown: str
    references: tuple[Snippet, ...]
    session_id: str
    policy_version: str
    created_at: str
    consulted: tuple[Snippet, ...] = ()
    attributed: bool = False
    support: SupportCheck | None = None
    invented_citations: int = 0
    answer_found: bool = True


def doc_from_session(record: SessionRecord) -> ExportDoc:
    """Build the export document of a stored, completed session.

    The body and the numbered references are the stored report's (`agent.report.stored_report`), so the numbers
    match the stored Markdown.

    Args:
        record: A session as read back by `SessionLog.get`.

    Returns:
        The document to render.

    Raises:
        ExportError: The session is not completed or has no stored report.
    """
    if record.status != "completed":
        raise ExportError(f"session {record.session_id!r} is {record.status!r}; only completed sessions have a report")
    if not record.report:
        raise ExportError(f"session {record.session_id!r} has no stored report to export")
    report = stored_report(record)
    consulted: tuple[Snippet, ...] = ()
    if not report.references:
        consulted = tuple(record.trajectory.snippets.values())[:MAX_UNCITED_SOURCES]
    return ExportDoc(
        title=" ".join(typed_question(record.question).split()),  # a follow-up's chat context is not its title
        body_markdown=report.body,
        references=report.references,
        session_id=record.session_id,
        policy_version=record.policy_version,
        created_at=record.created_at,
        consulted=consulted,
        attributed=report.attributed,
        support=report.support,
        invented_citations=report.unknown_citations,
        answer_found=report.answer_found,
    )


# --- shared helpers ---------------------------------------------------------------------------------------------


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _clip(text: str, limit: int = SNIPPET_CHARS) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def web_url(url: str) -> str | None:
    """The URL if it is an absolute http(s) URL (safe to make a link of), else None."""
    url = url.strip()
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    # Spaces, controls, quotes and angle brackets never occur in a well-formed URL, and would break out of an
    # attribute or a Markdown autolink.
    if parts.scheme.lower() in ("http", "https") and parts.netloc and not _URL_BREAKERS.search(url):
        return url
    return None


def _meta_line(doc: ExportDoc) -> str:
    return f"Session {doc.session_id} · policy {doc.policy_version} · {doc.created_at}"


# --- Markdown ---------------------------------------------------------------------------------------------------


def references_heading(doc: ExportDoc) -> str:
    """"References", or a heading that says the references were matched after writing."""
    return "References (matched after writing; the model cited none)" if doc.attributed else "References"


SUPPORT_HEADING = "Citation check"


def support_lines(doc: ExportDoc, escape: Callable[[str], str] = lambda t: t) -> list[str]:
    """One plain line per checked claim ("supported (0.82): the sentence", and for a vetoed citation why: "unsupported
    (0.84): the sentence (number: 2: not a number the passage states)"), or the reason it was not verified; empty
    when there is nothing to show. The sentences are the model's text: each renderer escapes them (`escape` for
    the ones that are not HTML-escaped afterwards). Missing evidence and invented ids come first, as in the report
    (agent.report)."""
    c = doc.support
    retrieved = bool(doc.references or doc.consulted)
    notes = [n for n in (evidence_sentence(retrieved, doc.references, c, doc.invented_citations,
                                           answered=doc.answer_found),
                         invented_sentence(doc.invented_citations)) if n]
    if c is None or not c.shown:
        return notes
    if not c.verified:
        return [*notes, f"Not verified: {escape(_one_line(c.note))}."]
    out = notes
    for x in c.claims:
        why = f" ({escape(_one_line(x.veto))})" if x.veto else ""
        out.append(f"{STATUS_WORDS[x.status]} ({x.score:.2f}): {escape(_one_line(_clip(x.text)))}{why}")
    if c.unchecked:
        out.append(f"{c.unchecked} more cited sentence(s) not checked (no words to check, or past the limit).")
    return out


_MD_INLINE = re.compile(r"([\\`*_\[\]<>&|~])")


def md_escape(text: str) -> str:
    """Text that Markdown shows as written: every character that opens inline markup (emphasis, code, links,
    raw HTML, entities, tables, strikethrough) is backslash-escaped. The claim never starts a line, so block
    markers ("#", "-", "1.") need no escape."""
    return _MD_INLINE.sub(r"\\\1", text)


def to_markdown(doc: ExportDoc) -> str:
    """The report as a Markdown file: question, metadata, answer, references with their snippets.

    The answer is the model's text verbatim; whoever renders this Markdown must treat it as untrusted. The citation
    check's lines quote it escaped (`md_escape`), so they read as the sentences were written.
    """
    lines = [f"# {_one_line(doc.title)}", "", f"_{_meta_line(doc)}_", "", doc.body_markdown.strip(), ""]
    sections = ((references_heading(doc), doc.references, True), ("Sources consulted (not cited in the text)", doc.consulted,
                                                        False))
    for heading, sources, numbered in sections:
        if not sources:
            continue
        lines += [f"## {heading}", ""]
        for n, s in enumerate(sources, 1):
            bullet = f"{n}." if numbered else "-"
            where = f" — <{web_url(s.url)}>" if web_url(s.url) else (f" — {_one_line(s.url)}" if s.url else "")
            lines.append(f"{bullet} **{_one_line(s.title) or s.id}**{where} (document `{s.id}`, {s.tool})")
            snippet = _one_line(_clip(s.text))
            if snippet:
                lines += ["", f"   > {snippet}", ""]
        lines.append("")
    if support := support_lines(doc, md_escape):  # the claims are escaped: this section is the exporter's text
        lines += [f"## {SUPPORT_HEADING}", "", *(f"- {ln}" for ln in support), ""]
    return "\n".join(lines).rstrip() + "\n"


# --- HTML -------------------------------------------------------------------------------------------------------


CITE = "rubricem_cite"  # token meta key: a `[n]` citation link the app made (the only kind of link that stays)


def _link_markers(state: StateCore) -> None:
    """markdown-it core rule: `[n]` in plain text becomes a link to `#ref-n` when reference n exists.

    Markers inside code spans stay text (they are separate tokens), and so do markers inside an existing link (a
    link cannot hold another link).
    """
    count = int(state.env.get("reference_count", 0))
    prefix = str(state.env.get("anchor_prefix", "ref-"))
    if not count:
        return
    for block in state.tokens:
        if block.type != "inline" or not block.children:
            continue
        out: list[Token] = []
        depth = 0
        for tok in block.children:
            if tok.type == "link_open":
                depth += 1
            elif tok.type == "link_close":
                depth -= 1
            if tok.type != "text" or depth > 0 or "[" not in tok.content:
                out.append(tok)
                continue
            pos = 0
            for m in _MARKER.finditer(tok.content):
                numbers = [int(x) for x in m.group(1).split(",")]
                if not any(1 <= n <= count for n in numbers):
                    continue
                if m.start() > pos:
                    out.append(_text_token(tok.content[pos : m.start()], tok.level))
                out += _marker_tokens(numbers, count, prefix, tok.level)
                pos = m.end()
            if pos < len(tok.content):
                out.append(_text_token(tok.content[pos:], tok.level))
        block.children = out


def _marker_tokens(numbers: list[int], count: int, prefix: str, level: int) -> list[Token]:
    """`[n]` as one link; `[1, 2]` as "[", a link per existing number, ", " between, "]" (missing numbers as text)."""

    def link(label: str, n: int) -> list[Token]:
        return [Token("link_open", "a", 1, attrs={"href": f"#{prefix}{n}", "class": "cite"}, level=level,
                      meta={CITE: True}),
                _text_token(label, level + 1), Token("link_close", "a", -1, level=level)]

    if len(numbers) == 1:
        return link(f"[{numbers[0]}]", numbers[0])
    out = [_text_token("[", level)]
    for i, n in enumerate(numbers):
        if i:
            out.append(_text_token(", ", level))
        out += link(str(n), n) if 1 <= n <= count else [_text_token(str(n), level)]
    out.append(_text_token("]", level))
    return out


def _text_token(content: str, level: int) -> Token:
    return Token("text", "", 0, content=content, level=level)


def _model_links_as_text(state: StateCore) -> None:
    """markdown-it core rule, after `_link_markers`: every link the model wrote (`[text](url)`, `<url>`, a reference
    link) loses its anchor. Its text stays, followed by the URL in parentheses unless the text is the URL (an
    autolink), all plain text a reader can see but not click (SECURITY.md: model and tool output cannot add links
    to a page). A `rel="nofollow"` anchor was still a link the model composed, for a reader to follow or a PDF viewer
    to open. The citation links `_link_markers` made (marked `CITE`) stay: they point at the references the app
    lists from the sources the session retrieved."""
    for block in state.tokens:
        if block.type != "inline" or not block.children:
            continue
        out: list[Token] = []
        opened: Token | None = None  # the model's link being unwrapped (CommonMark links never nest)
        for tok in block.children:
            if tok.type == "link_open" and not tok.meta.get(CITE):
                opened = tok
                continue
            if tok.type == "link_close" and opened is not None:
                href = str(opened.attrGet("href") or "")
                if href and opened.markup != "autolink":
                    out.append(_text_token(f" ({href})", tok.level))
                opened = None
                continue
            out.append(tok)
        block.children = out


@lru_cache(maxsize=1)
def _markdown() -> MarkdownIt:
    """CommonMark with raw HTML off (escaped as text) and images off (never fetch what the model points at)."""
    md = MarkdownIt("commonmark", {"html": False, "maxNesting": 100}).disable("image")
    md.core.ruler.push("cite_links", _link_markers)
    md.core.ruler.push("model_links_as_text", _model_links_as_text)
    return md


def answer_html(body_markdown: str, reference_count: int, anchor_prefix: str = "ref-") -> str:
    """The answer rendered as an HTML fragment (raw HTML escaped, images off); `[n]` and `[1, 2]` markers link to
    `#{anchor_prefix}n` for n in 1..reference_count. The chat UI and the HTML export share this one renderer."""
    return _markdown().render(body_markdown, {"reference_count": reference_count, "anchor_prefix": anchor_prefix})


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:46rem;margin:2rem auto;padding:0 1rem;
line-height:1.55;color:#1d1d1f}
h1{font-size:1.6rem;line-height:1.25}.meta{color:#666;font-size:.85rem}
a.cite{text-decoration:none;font-size:.8em;vertical-align:super}
ol.references li,ul.consulted li{margin-bottom:.8rem}.ref-title{font-weight:600}
blockquote{margin:.3rem 0 0;padding-left:.8rem;border-left:3px solid #ddd;color:#444;font-size:.9rem}
pre{overflow-x:auto;background:#f5f5f5;padding:.6rem}code{background:#f5f5f5}
""".strip()

# No scripts, no remote loads of any kind: the page is complete on its own and stays inert whatever the model wrote.
_CSP = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


def _source_html(s: Snippet, item_id: str | None) -> str:
    e = html.escape
    title = _one_line(s.title) or s.id
    url = web_url(s.url)
    if url:
        where = f' — <a href="{e(url, quote=True)}" rel="nofollow noopener noreferrer">{e(url)}</a>'
    elif s.url.strip():  # a local path or another non-web location: shown, never a link
        where = f' — <span class="ref-location">{e(_one_line(s.url))}</span>'
    else:
        where = ""
    attr = f' id="{item_id}"' if item_id else ""
    snippet = _clip(s.text)
    quote = f"<blockquote>{e(snippet)}</blockquote>" if snippet else ""
    return (f'<li{attr}><span class="ref-title">{e(title)}</span>{where} '
            f'<span class="ref-id">(document <code>{e(s.id)}</code>, {e(s.tool)})</span>{quote}</li>')


def to_html(doc: ExportDoc) -> str:
    """A complete, standalone HTML document of the report (UTF-8, inline CSS, no scripts, no remote resources).

    Everything from the model or a tool is escaped; `[n]` markers link to the list item `id="ref-n"`.
    """
    e = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<meta name="generator" content="rubricem">',
        f"<title>{e(_one_line(doc.title))}</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        "<body>",
        "<article>",
        f"<h1>{e(_one_line(doc.title))}</h1>",
        f'<p class="meta">{e(_meta_line(doc))}</p>',
        f'<section class="answer">\n{answer_html(doc.body_markdown, len(doc.references))}</section>',
    ]
    if doc.references:
        items = "\n".join(_source_html(s, f"ref-{n}") for n, s in enumerate(doc.references, 1))
        parts.append(f'<section id="references">\n<h2>{html.escape(references_heading(doc))}</h2>\n<ol class="references">\n{items}\n</ol>\n'
                     "</section>")
    if doc.consulted:
        items = "\n".join(_source_html(s, None) for s in doc.consulted)
        parts.append(f'<section id="consulted">\n<h2>Sources consulted (not cited in the text)</h2>\n'
                     f'<ul class="consulted">\n{items}\n</ul>\n</section>')
    if support := support_lines(doc):
        items = "\n".join(f"<li>{e(ln)}</li>" for ln in support)
        parts.append(f'<section id="citation-check">\n<h2>{SUPPORT_HEADING}</h2>\n<ul>\n{items}\n</ul>\n</section>')
    parts += ["</article>", "</body>", "</html>", ""]
    return "\n".join(parts)


# --- PDF --------------------------------------------------------------------------------------------------------

FONT_DIRS: tuple[Path, ...] = (Path("/usr/share/fonts"), Path("/usr/local/share/fonts"))
"""Where `find_pdf_fonts` looks (recursively) for the Unicode fonts below."""

# DejaVu Sans covers Latin, Greek, Cyrillic, Arabic, Hebrew and many symbols; Debian ships it as fonts-dejavu-core
# (present wherever fontconfig or a browser is installed, but NOT in python:3.11-slim). It has no CJK glyphs, so known
# CJK fonts (fonts-noto-cjk, fonts-droid-fallback, fonts-wqy-*) are used as fallbacks when installed.
_DEJAVU = {"": "DejaVuSans.ttf", "B": "DejaVuSans-Bold.ttf", "I": "DejaVuSans-Oblique.ttf",
           "BI": "DejaVuSans-BoldOblique.ttf"}
_DEJAVU_MONO = "DejaVuSansMono.ttf"
_CJK_FALLBACKS = ("NotoSansCJK-Regular.ttc", "DroidSansFallbackFull.ttf", "DroidSansFallback.ttf",
                  "wqy-microhei.ttc", "wqy-zenhei.ttc")
# Core-font fallback: typographic characters outside Latin-1 get their plain equivalents before "?" is used.
_ASCII_EQUIVALENTS = str.maketrans({
    "\u2014": "-", "\u2013": "-", "\u2012": "-", "\u2212": "-", "\u2018": "'", "\u2019": "'", "\u201a": "'",
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u2026": "...", "\u2022": "*", "\u00a0": " ", "\u2009": " ",
    "\u202f": " ", "\u200b": "",
})


@dataclass(frozen=True)
class PdfFonts:
    """The TTF files a PDF is set in. `styles` maps "", "B", "I", "BI" to files ("" is required)."""

    styles: tuple[tuple[str, Path], ...]
    mono: Path | None = None
    fallbacks: tuple[Path, ...] = ()


def _find(dirs: Iterable[Path], names: Iterable[str]) -> dict[str, Path]:
    wanted = set(names)
    found: dict[str, Path] = {}
    for folder in dirs:
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*")):
            if path.name in wanted and path.name not in found and path.is_file():
                found[path.name] = path
    return found


def find_pdf_fonts(dirs: Sequence[Path] = FONT_DIRS) -> PdfFonts | None:
    """Look for DejaVu Sans (and CJK fallbacks) under `dirs`; None when there is no Unicode font to use.

    Args:
        dirs: Font folders, searched recursively in order.

    Returns:
        The fonts to embed, or None (the PDF then uses a core font and replaces characters it cannot show).
    """
    found = _find(dirs, [*_DEJAVU.values(), _DEJAVU_MONO, *_CJK_FALLBACKS])
    regular = found.get(_DEJAVU[""])
    if regular is None:
        return None
    # A missing style variant falls back to the regular face: plainer, but every character still shows.
    styles = tuple((style, found.get(name, regular)) for style, name in _DEJAVU.items())
    return PdfFonts(styles=styles, mono=found.get(_DEJAVU_MONO),
                    fallbacks=tuple(found[n] for n in _CJK_FALLBACKS if n in found))


@lru_cache(maxsize=1)
def _system_fonts() -> PdfFonts | None:
    """`find_pdf_fonts()` over the system folders, searched once per process (a tree walk per export is slow)."""
    return find_pdf_fonts()


@lru_cache(maxsize=16)
def _coverage(path: Path) -> frozenset[int]:
    """Code points a font file has glyphs for (fontTools comes with fpdf2)."""
    from fontTools.ttLib import TTFont

    with TTFont(path, lazy=True, fontNumber=0) as font:
        return frozenset(font.getBestCmap() or {})


def _fit_text(text: str, covered: frozenset[int] | None, encoding: str) -> str:
    """Text the PDF's fonts can show: uncovered characters become "?" (never a crash, never an invisible gap)."""
    # Control characters have no glyph anywhere (markdown-it would also turn NUL into U+FFFD); tabs and newlines stay.
    text = _CONTROL.sub("", text)
    if covered is None:  # core font: only its single-byte encoding exists
        text = text.translate(_ASCII_EQUIVALENTS)
        return text.encode(encoding, "replace").decode(encoding)
    return "".join(c if ord(c) in covered or c in "\n\t" else "?" for c in text)


def _pdf_source(n: str, s: Snippet, fit: Any) -> str:
    e = html.escape
    title = fit(_one_line(s.title) or s.id)
    url = web_url(s.url)
    if url:
        where = f'<a href="{e(url, quote=True)}">{e(fit(url))}</a> '
    elif s.url.strip():
        where = e(fit(_one_line(s.url))) + " "
    else:
        where = ""
    snippet = fit(_one_line(_clip(s.text)))
    return (f"<p><b>{e(n)}{e(title)}</b><br>{where}(document {e(fit(s.id))}, {e(fit(s.tool))})"
            + (f"<br><i>{e(snippet)}</i>" if snippet else "") + "</p>")


def to_pdf(doc: ExportDoc, *, fonts: PdfFonts | None | str = "auto") -> bytes:
    """The report as a PDF: question, metadata, answer (Markdown rendered), references with URL and snippet.

    Set in DejaVu Sans when the system has it (see `find_pdf_fonts`); characters no available font covers, such as
    CJK without a CJK font installed, print as "?". Without any Unicode font the PDF falls back to Helvetica and
    Latin-1: typographic punctuation is replaced by plain equivalents and everything else outside Latin-1 by "?".
    An answer fpdf2 cannot lay out (e.g. lists nested too deep for the page width) is printed as its Markdown text.

    Args:
        doc: The document.
        fonts: "auto" to search `FONT_DIRS`, explicit fonts, or None to force the core-font fallback.

    Returns:
        The PDF file's bytes.

    Raises:
        ValueError: `fonts` is neither "auto", None nor a PdfFonts with a regular face.
    """
    from fpdf.errors import FPDFException  # fpdf2 takes a few hundred ms to import; only exports need it

    if isinstance(fonts, str):
        if fonts != "auto":
            raise ValueError(f'fonts must be "auto", PdfFonts or None, got {fonts!r}')
        chosen = _system_fonts()
    else:
        chosen = fonts
    if chosen is not None and "" not in dict(chosen.styles):
        raise ValueError('PdfFonts.styles needs the regular face (style "")')
    try:
        return _render_pdf(doc, chosen, plain_answer=False)
    except FPDFException:
        return _render_pdf(doc, chosen, plain_answer=True)


def _render_pdf(doc: ExportDoc, chosen: PdfFonts | None, *, plain_answer: bool) -> bytes:
    from fpdf import FPDF

    pdf = FPDF(format="A4")
    pdf.set_margins(18, 18, 18)
    pdf.set_auto_page_break(True, margin=18)
    pdf.set_title(_one_line(doc.title)[:500])
    pdf.set_creator("rubricem")
    covered: frozenset[int] | None = None
    if chosen is None:
        family, mono = "helvetica", "courier"
    else:
        family, mono = "rubricem-sans", "rubricem-mono"
        styles = dict(chosen.styles)
        for style in ("", "B", "I", "BI"):  # headings and emphasis need every style; a missing one uses the regular
            pdf.add_font(family, style, styles.get(style, styles[""]))
        pdf.add_font(mono, "", chosen.mono or styles[""])
        names = [f"rubricem-fallback-{i}" for i in range(len(chosen.fallbacks))]
        for name, path in zip(names, chosen.fallbacks, strict=True):
            pdf.add_font(name, "", path)
        if names:
            pdf.set_fallback_fonts(names, exact_match=False)
        # Coverage of the regular face and the fallbacks: a character they lack prints as "?" (see `_fit_text`).
        covered = frozenset().union(*(_coverage(p) for p in (styles[""], *chosen.fallbacks)))

    def fit(text: str) -> str:
        return _fit_text(text, covered, pdf.core_fonts_encoding)

    e = html.escape
    body = fit(doc.body_markdown)
    if plain_answer:
        answer = "".join(f"<p>{e(para).replace(chr(10), '<br>')}</p>" for para in re.split(r"\n\s*\n", body.strip()))
    else:
        answer = answer_html(body, 0)
    fragment = [f"<h1>{e(fit(_one_line(doc.title)))}</h1>", f"<p><i>{e(fit(_meta_line(doc)))}</i></p>", answer]
    if doc.references:
        fragment.append(f"<h2>{html.escape(references_heading(doc))}</h2>")
        fragment += [_pdf_source(f"[{n}] ", s, fit) for n, s in enumerate(doc.references, 1)]
    if doc.consulted:
        fragment.append("<h2>Sources consulted (not cited in the text)</h2>")
        fragment += [_pdf_source("", s, fit) for s in doc.consulted]
    if support := support_lines(doc):
        fragment.append(f"<h2>{SUPPORT_HEADING}</h2>")
        fragment += [f"<p>{e(fit(ln))}</p>" for ln in support]
    pdf.add_page()
    pdf.set_font(family, size=11)
    pdf.write_html("\n".join(fragment), font_family=family,
                   tag_styles=_pdf_tag_styles(mono), warn_on_tags_not_matching=False)
    return bytes(pdf.output())


def _pdf_tag_styles(mono: str) -> dict[str, Any]:
    from fpdf.fonts import FontFace

    # fpdf2's default for code is the core Courier font, which cannot show non-Latin-1 text.
    return {"code": FontFace(family=mono), "pre": FontFace(family=mono)}
