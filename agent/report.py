"""The final report: the answer as Markdown with numbered references, every citation checked against the snippets
actually retrieved in this session (an invented id is removed and counted, and a claim it leaves without a source is
marked unsupported), then against what the passage says (`verify_report`, agent/support.py: re-attributed, or uncited
and marked). A report with no evidence behind it says so in one sentence. No <think> text or raw tags leak."""

from __future__ import annotations

import html
import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from agent import parse
from agent.followup import typed_question
from agent.support import UNSUPPORTED_MARK, Embed, SupportCheck, check_support, support_sentence  # Embed: re-exported
from store.records import SessionRecord, Snippet, Trajectory


ATTRIBUTION_MIN_COSINE = 0.5
"""A sentence is matched to a passage only at this MiniLM cosine or above. Measured on the bundled corpus: a sentence
restating a passage scores ~0.6-0.9 against it, a sentence on another topic ~0.0-0.3."""
_MIN_SENTENCE_CHARS = 12
_SENTENCES = re.compile(r"(?<=[.!?])(\s+)")
_MARKUP = re.compile(r"<[^<>]*>?")  # tags (and a cut-off one) the answer left in: never what a sentence claims
_LETTERS = re.compile(r"[^A-Za-z\u00C0-\uFFFF]")


@dataclass(frozen=True, slots=True)
class Report:
    """A rendered report and what the citation check found."""

    markdown: str
    body: str  # the answer alone, with [n] markers
    references: tuple[Snippet, ...]  # in reference-number order
    unknown_citations: int  # cited ids no tool returned in this session (invented): removed, counted in the report
    answer_found: bool
    attributed: bool = False  # the [n] markers were matched after writing (the model cited nothing)
    support: SupportCheck | None = None  # the support check (None: not run, as for sessions before it existed)
    raw_body: str = ""  # the body before the support check repaired it ("" when it changed nothing or did not run)


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
    body, unknown = _markers(raw, known, order)
    body = _tidy(html.unescape(parse.strip_tags(body)))  # tool output was HTML-escaped for the model
    body = _bare_ids_cited(body, known, order)
    refs = tuple(known[cid] for cid in order)
    found = bool(body)
    if not found:
        body = "_The model produced no answer text._"
    return Report(_markdown(traj, body, refs, attributed=False, invented=unknown, answered=found), body, refs,
                  unknown, found)


def _markers(raw: str, known: Mapping[str, Snippet], order: list[str]) -> tuple[str, int]:
    """The answer with its `<cite>` tags as [n] markers (numbered by `order`), and how many cited ids no tool
    returned in this session (invented). An invented id is removed; a claim it leaves with no retrieved id gets the
    unsupported mark before its closing stop, where no sentence splitter can part them: left bare, it would read as
    a statement that never claimed a source (issue 64)."""
    invented = [cid for cite in parse.find_citations(raw) for cid in cite.ids if cid not in known]
    numbers = {cid: i + 1 for i, cid in enumerate(order)}
    if not invented:
        return parse.replace_citations(raw, numbers)[0], 0
    # A number no reference has and the answer never wrote stands for every invented id, then is rewritten away.
    flag = next(k for k in itertools.chain((0,), itertools.count(len(order) + 1)) if f"[{k}]" not in raw)
    body = parse.replace_citations(raw, numbers | dict.fromkeys(invented, flag))[0]
    body = re.sub(rf"((?:\[\d+\])+)\[{flag}\]|\[{flag}\]((?:\[\d+\])+)", lambda m: m.group(1) or m.group(2), body)
    body = re.sub(rf"([.!?]*) \[{flag}\]", lambda m: f" {UNSUPPORTED_MARK}{m.group(1)}", body)
    return body, len(invented)


def verify_report(report: Report, traj: Trajectory, embed: Embed) -> Report:
    """Check every cited claim against its passage and repair the report (agent/support.py); `raw_body` keeps the
    body as it was. A report with no answer or no citation is returned with an empty, verified check.

    Raises:
        Whatever `embed` raises: the caller shows the report as `unverified_report`.
    """
    if not report.answer_found or not report.references:
        return replace(report, support=SupportCheck(()))
    fixed = check_support(report.body, report.references, list(traj.snippets.values()), embed)
    refs = tuple(traj.snippets[i] for i in fixed.order)
    changed = fixed.body != report.body or fixed.order != tuple(s.id for s in report.references)
    raw = report.body if changed else ""  # its [n] numbered the old references: each claim's `cited` names them
    markdown = _markdown(traj, fixed.body, refs, report.attributed, fixed.check, report.unknown_citations,
                         answered=report.answer_found)
    return replace(report, markdown=markdown, body=fixed.body, references=refs, support=fixed.check, raw_body=raw)


def unverified_report(report: Report, traj: Trajectory, reason: str) -> Report:
    """The report as written, saying its citations could not be checked (the scorer was unavailable) and why."""
    check = SupportCheck((), verified=False, note=reason)
    markdown = _markdown(traj, report.body, report.references, report.attributed, check, report.unknown_citations,
                         answered=report.answer_found)
    return replace(report, markdown=markdown, support=check)


NO_PASSAGES = ("No evidence was found: no search in this session returned a passage, so nothing in this answer "
               "rests on a source.")
NOTHING_SUPPORTED = ("No evidence was found for this answer: no passage this session retrieved supports any of its "
                     f"cited sentences, and each is marked {UNSUPPORTED_MARK}.")
NOTHING_CITED = ("No evidence is cited for this answer: it cites no source, so none of its sentences is tied to a "
                 "passage this session retrieved.")


def evidence_sentence(retrieved: bool, refs: tuple[Snippet, ...], support: SupportCheck | None, invented: int, *,
                      answered: bool) -> str | None:
    """One plain sentence when no evidence stands behind the answer (issue 64), else None: nothing was retrieved;
    the answer cited and not one of its citations is left (each was invented or failed the check); or the answer
    cites nothing at all and no passage was matched to it after writing (its sources are listed as consulted, not
    as cited). A session with no answer text gets none of the last two: the report already says there is none."""
    if not retrieved:
        return NO_PASSAGES
    if refs:
        return None
    checked = support is not None and support.verified and bool(support.claims)
    if invented or checked:
        return NOTHING_SUPPORTED
    return NOTHING_CITED if answered else None


def invented_sentence(invented: int) -> str | None:
    """The count of invented citation ids for the report, or None when there were none."""
    if not invented:
        return None
    return (f"Invented citation ids: {invented} (no search in this session returned them); they were removed, and a "
            f"sentence left with no other citation is marked {UNSUPPORTED_MARK}.")


def _notes(traj: Trajectory, refs: tuple[Snippet, ...], support: SupportCheck | None, invented: int,
           answered: bool) -> list[str]:
    """The lines under the answer: the missing evidence (bold: it changes how the whole answer reads), then the
    citation check and the invented ids."""
    lines: list[str] = []
    if missing := evidence_sentence(bool(traj.snippets), refs, support, invented, answered=answered):
        lines += [f"**{missing}**", ""]
    for sentence in (support_sentence(support) if support is not None else None, invented_sentence(invented)):
        lines += [f"_{sentence}_", ""] if sentence else []
    return lines


def _markdown(traj: Trajectory, body: str, refs: tuple[Snippet, ...], attributed: bool,
              support: SupportCheck | None = None, invented: int = 0, *, answered: bool) -> str:
    lines = [f"# {_one_line(typed_question(traj.question))}", "", body, "",
             *_notes(traj, refs, support, invented, answered)]
    known = traj.snippets
    if refs:
        lines += ["## References", ""]
        if attributed:
            lines += [("_The model cited no sources. Each marked sentence was matched, after writing, to the most "
                      "similar retrieved passage; check them before relying on them._"), ""]
        lines += [*(_ref_line(f"{i}.", s) for i, s in enumerate(refs, 1)), ""]
    elif known:
        # Nothing was cited in the text (common with very small models): still show what the answer rests on,
        # clearly labelled, so the reader can check it.
        shown = list(known.values())[:MAX_UNCITED_SOURCES]
        lines += ["## Sources consulted (not cited in the text)", "", *(_ref_line("-", s) for s in shown), ""]
    return "\n".join(lines)


def attribute_report(report: Report, traj: Trajectory, embed: Embed,
                     min_cosine: float = ATTRIBUTION_MIN_COSINE) -> Report:
    """Match an uncited answer's sentences to the retrieved passages they restate, as numbered references.

    Small policies often write a grounded answer without `<cite>` tags. Each sentence (12+ characters) gets the
    number of its most similar passage when the cosine is at least `min_cosine`; the report says the references
    were matched after writing. A report that already cites, has no answer or no passages is returned unchanged,
    and so is one where nothing matches. The judge never sees this: rewards score the model's own citations.
    """
    if report.references or not report.answer_found or not traj.snippets:
        return report
    passages = list(traj.snippets.values())
    paragraphs = report.body.split("\n\n")
    pieces = [_SENTENCES.split(p) for p in paragraphs]  # sentences at even positions, whitespace at odd ones
    slots = [(pi, si) for pi, parts in enumerate(pieces) for si in range(0, len(parts), 2)
             if len(_LETTERS.sub("", _MARKUP.sub(" ", parts[si]))) >= _MIN_SENTENCE_CHARS  # not markup debris
             and UNSUPPORTED_MARK not in parts[si]]  # it cited an invented id: a match would hide that
    if not slots:
        return report
    vectors = np.asarray(embed([_MARKUP.sub(" ", pieces[pi][si]) for pi, si in slots]
                               + [f"{p.title}. {p.text}" for p in passages]), dtype=np.float32)
    sims = vectors[: len(slots)] @ vectors[len(slots):].T  # (sentences, passages)
    order: list[str] = []
    for (pi, si), row in zip(slots, sims, strict=True):
        best = int(row.argmax())
        if float(row[best]) < min_cosine:
            continue
        pid = passages[best].id
        if pid not in order:
            order.append(pid)
        pieces[pi][si] = f"{pieces[pi][si].rstrip()} [{order.index(pid) + 1}]"
    if not order:
        return report
    body = "\n\n".join("".join(parts) for parts in pieces)
    refs = tuple(traj.snippets[pid] for pid in order)
    markdown = _markdown(traj, body, refs, True, invented=report.unknown_citations, answered=report.answer_found)
    return replace(report, markdown=markdown, body=body, references=refs, attributed=True)


def report_fields(report: Report) -> dict[str, Any]:
    """What the session log keeps of a report (in its metrics) so `stored_report` gives back exactly this one."""
    out = {"body": report.body, "references": [s.id for s in report.references], "attributed": report.attributed,
           "unknown_citations": report.unknown_citations, "answer_found": report.answer_found}
    if report.support is not None:
        out["support"] = report.support.as_dict()
    if report.raw_body:
        out["raw_body"] = report.raw_body
    return out


STORED_UNCHECKED = "this stored report was never checked against its passages"
STORED_UNREADABLE = "this stored report's citation check could not be read"
STORED_REBUILT = "this report was rebuilt from the stored session, without a citation check"


def stored_report(record: SessionRecord) -> Report:
    """The report of a stored session: as kept in its metrics, else rebuilt from the trajectory (older sessions).

    A report with citations and no readable check (stored before the check existed, with the check turned off, with
    a damaged check, or rebuilt) says its citations are not verified and why: served from storage, it must never
    read as checked when it was not (issue 64)."""
    kept = record.metrics.get("report") if isinstance(record.metrics, Mapping) else None
    known = record.trajectory.snippets
    refs = kept.get("references") if isinstance(kept, Mapping) else None
    if isinstance(kept, Mapping) and isinstance(refs, list) and all(isinstance(i, str) and i in known for i in refs):
        support = _stored_support(kept.get("support"))
        report = Report(record.report or "", str(kept.get("body", "")), tuple(known[i] for i in refs),
                        int(kept.get("unknown_citations", 0)), bool(kept.get("answer_found", True)),
                        bool(kept.get("attributed", False)), support, str(kept.get("raw_body", "")))
        if support is None and report.references:
            why = STORED_UNREADABLE if kept.get("support") is not None else STORED_UNCHECKED
            return unverified_report(report, record.trajectory, why)
        return report
    report = build_report(record.trajectory)
    return unverified_report(report, record.trajectory, STORED_REBUILT) if report.references else report


def _stored_support(kept: object) -> SupportCheck | None:
    """The stored support check, or None when there is none or it does not parse (an older or damaged record)."""
    if not isinstance(kept, Mapping):
        return None
    try:
        return SupportCheck.from_dict(dict(kept))
    except (TypeError, ValueError):
        return None


MAX_UNCITED_SOURCES = 10


def _ref_line(bullet: str, s: Snippet) -> str:
    where = f" — <{s.url}>" if s.url else ""
    return f"{bullet} **{_one_line(s.title) or s.id}**{where} (`{s.id}`, {s.tool})"


def _one_line(text: str) -> str:
    return " ".join(parse.strip_tags(text).split())


def _bare_ids_cited(body: str, known: Mapping[str, Snippet], order: list[str]) -> str:
    """A snippet id the answer wrote as plain text (a small model's way of pointing at a passage: "the answer is
    2d400828-0") becomes a citation marker [n] with its reference, so a bare id is never shown as the answer. Only
    ids a tool returned in this session, as whole tokens; `order` gains the new ones."""
    for cid in sorted(known, key=len, reverse=True):  # the longer id first where one contains another
        pattern = re.compile(rf"(?<![\w-]){re.escape(cid)}(?![\w-])")
        if not pattern.search(body):
            continue
        if cid not in order:
            order.append(cid)
        body = pattern.sub(f"[{order.index(cid) + 1}]", body)
    return body


def _tidy(text: str) -> str:
    lines = [ln.rstrip() for ln in text.strip().splitlines()]
    out: list[str] = []
    for ln in lines:
        if ln or (out and out[-1]):  # collapse runs of blank lines
            out.append(ln)
    return "\n".join(out).strip()
