"""The final report: the answer as Markdown with numbered references, every citation checked against the snippets
actually retrieved in this session (unknown ids are removed and counted). No <think> text or raw tags leak."""

from __future__ import annotations

import html
from dataclasses import dataclass

from agent import parse
from store.records import Snippet, Trajectory


@dataclass(frozen=True, slots=True)
class Report:
    """A rendered report and what the citation check found."""

    markdown: str
    body: str  # the answer alone, with [n] markers
    references: tuple[Snippet, ...]  # in reference-number order
    unknown_citations: int  # cited ids that no tool returned in this session (removed)
    answer_found: bool


def answer_text(traj: Trajectory) -> str:
    """The raw answer block of the trajectory (sampled and forced answer turns together)."""
    text = "".join(t.text for t in traj.turns if t.stage == "answer")
    return parse.extract_answer(text)


def build_report(traj: Trajectory) -> Report:
    """Render the trajectory's answer as a cited Markdown report."""
    raw = parse.strip_process_blocks(parse.strip_think(answer_text(traj)))
    known = traj.snippets
    order: list[str] = []
    for cite in parse.find_citations(raw):
        for cid in cite.ids:
            if cid in known and cid not in order:
                order.append(cid)
    numbers = {cid: i + 1 for i, cid in enumerate(order)}
    body, unknown, _ = parse.replace_citations(raw, numbers)
    body = _tidy(html.unescape(parse.strip_tags(body)))  # tool output was HTML-escaped for the model
    refs = tuple(known[cid] for cid in order)
    found = bool(body)
    if not found:
        body = "_The model produced no answer text._"
    lines = [f"# {_one_line(traj.question)}", "", body, ""]
    if refs:
        lines += ["## References", "", *(_ref_line(f"{i}.", s) for i, s in enumerate(refs, 1)), ""]
    elif known:
        # Nothing was cited in the text (common with very small models): still show what the answer rests on,
        # clearly labelled, so the reader can check it.
        shown = list(known.values())[:MAX_UNCITED_SOURCES]
        lines += ["## Sources consulted (not cited in the text)", "", *(_ref_line("-", s) for s in shown), ""]
    return Report("\n".join(lines), body, refs, unknown, found)


MAX_UNCITED_SOURCES = 10


def _ref_line(bullet: str, s: Snippet) -> str:
    where = f" — <{s.url}>" if s.url else ""
    return f"{bullet} **{_one_line(s.title) or s.id}**{where} (`{s.id}`, {s.tool})"


def _one_line(text: str) -> str:
    return " ".join(parse.strip_tags(text).split())


def _tidy(text: str) -> str:
    lines = [ln.rstrip() for ln in text.strip().splitlines()]
    out: list[str] = []
    for ln in lines:
        if ln or (out and out[-1]):  # collapse runs of blank lines
            out.append(ln)
    return "\n".join(out).strip()
