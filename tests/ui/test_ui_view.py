"""The chat's view model: events fold into the same view a stored session gives; citations become safe links."""

from __future__ import annotations

import html
from dataclasses import replace

from markdown_it import MarkdownIt

from agent.followup import FOLLOW_UP_MARK, follow_up_question, typed_question
from agent.report import build_report
from app import events as ev
from app.ui.view import (
    RunView,
    anchor,
    cited_html,
    one_line_html,
    references_html,
    support_caption,
    support_rows,
)
from store.records import SessionRecord, Snippet
from tests.judge.builders import PLAN, trajectory


def _events_of(traj) -> list[ev.Event]:  # type: ignore[no-untyped-def]
    """The events a live run of `traj` emits, in order (as app.service's recorder sends them)."""
    out: list[ev.Event] = [ev.SessionStarted("s1", "policy@2")]
    calls = iter(traj.tool_calls)
    for turn in traj.turns:
        if turn.kind == "tool_output":
            call = next(calls)
            out += [ev.SearchIssued(call.tool, call.query),
                    ev.SourcesFound(call.tool, call.query, call.snippets, call.error)]
        else:
            out.append(ev.StageStarted(turn.stage))
        out.append(ev.TurnWritten(turn.stage, turn.kind, turn.text))
    return out


def test_live_events_and_the_stored_session_give_the_same_view() -> None:
    traj = trajectory()
    live = RunView(question=traj.question)
    for e in _events_of(traj):
        live.apply(e)
    assert live.stages["answer"].state == "running" and live.stages["plan"].state == "complete"
    live.complete(build_report(traj))
    record = SessionRecord(session_id="s1", question=traj.question, status="completed", created_at="t",
                           finished_at="t", policy_version="policy@2", options={}, trajectory=traj,
                           report=build_report(traj).markdown)
    stored = RunView.from_record(record)
    for view in (live, stored):
        assert view.status == "completed" and view.policy_version == "policy@2"
        assert all(s.state == "complete" for s in view.stages.values())
        assert view.checklist == ["the language books were translated into", "the period Haymo lived in"]
        (search,) = view.stages["research"].searches
        assert search.done and search.query == "Haymo of Faversham translation" and len(search.sources) == 1
        assert view.report is not None and view.report.body == "Books were translated into Latin [1]."
        assert not any("<" in t for t in view.stages["plan"].texts)  # tags are not shown as text
    assert live.stages["plan"].texts == stored.stages["plan"].texts


def test_a_failed_run_shows_its_error_and_unreached_stages_stay_waiting() -> None:
    view = RunView(question="q")
    view.apply(ev.SessionStarted("s9", "base"))
    view.apply(ev.StageStarted("plan"))
    view.apply(ev.TurnWritten("plan", "sampled", PLAN))
    view.apply(ev.Note("research_stopped", {"reason": "budget", "tool_calls": 0}))
    view.apply(ev.RunFailed("s9", "RuntimeError: the policy server went away"))
    assert view.status == "failed" and "went away" in (view.error or "")
    assert view.stages["plan"].state == "complete" and view.stages["answer"].state == "waiting"
    assert view.notes == ["Research stopped (budget) after 0 tool calls."]


def test_tool_errors_and_bank_use_are_shown() -> None:
    traj = trajectory(tool_error="HTTP 503 from the search backend")
    view = RunView(question=traj.question)
    for e in _events_of(traj):
        view.apply(e)
    (search,) = view.stages["research"].searches
    assert search.error == "HTTP 503 from the search backend" and search.sources == ()
    assert view.bank_items == []
    # The chat names only the viewer's own items among these (chat_page.own_reflections, tests/ui/
    # test_ui_bank_oracle.py); the view keeps what the run used, in order.
    view.apply(ev.ReferencesInjected("cross", (ev.BankReference("b1", "a similar question", 0.71),
                                               ev.BankReference("b2", "another", 0.55))))
    assert view.bank_mode == "cross" and [i.item_id for i in view.bank_items] == ["b1", "b2"]
    view.apply(ev.ReferencesInjected("within", (ev.BankReference("b3", traj.question, 1.0),)))
    assert view.bank_mode == "within" and [i.item_id for i in view.bank_items] == ["b3"]


def test_citations_link_to_the_references_and_model_text_is_escaped() -> None:
    report = build_report(trajectory(answer='<b>Bold</b> <script>alert(1)</script> Latin '
                                            '<cite id="abcd0001-0">it was Latin</cite>. See [7].'))
    body = cited_html(report, "sess/1")
    assert f'<a href="#{anchor("sess/1", 1)}" class="cite">' in body and anchor("sess/1", 1) == "ref-sess1-1"
    assert "<script>" not in body and "&lt;script&gt;alert(1)&lt;/script&gt;" in body and "<b>" not in body
    assert "[7]" in body and 'href="#ref-sess1-7"' not in body  # a number with no reference is not a link
    # the answer's Markdown is drawn (the chat and the HTML export share one renderer); [1, 7] links only 1
    md = cited_html(replace(report, body="## Findings\n\n- **Latin** [1, 7]\n- ![x](https://evil.example/x.png)"),
                    "s")
    assert "<h2>Findings</h2>" in md and "<strong>Latin</strong>" in md and "<img" not in md
    assert '[<a href="#ref-s-1" class="cite">1</a>, 7]' in md
    refs = references_html(replace(report, references=(
        Snippet("x-0", "web", "A <i>title</i>", "text", "javascript:alert(1)"),
        Snippet("x-1", "web", "Safe", "text", "https://example.org/a?b=1&c=2"))), "s")
    assert 'href="javascript' not in refs and "&lt;i&gt;" in refs
    assert 'href="https://example.org/a?b=1&amp;c=2"' in refs and 'id="ref-s-2"' in refs


def test_blank_lines_in_the_answer_or_a_source_url_never_reach_the_markdown_parser() -> None:
    """Issue 46, finding 1: the page hands these panels to Streamlit's Markdown renderer with raw HTML on, where a
    blank line ends the HTML block. Rendered the same way (CommonMark, html on) they must come back unchanged: one
    HTML block, no image. The browser test (test_ui_browser_markup) shows the same on the real page."""
    pixel = "![x](http://127.0.0.1:9/b.png)"
    report = build_report(trajectory(answer='Latin <cite id="abcd0001-0">it was Latin</cite>.'))
    crafted = [replace(report, body=f"Latin [1].\n\n```\nquoted{gap}{pixel}\n```", references=(
        Snippet("abcd0001-0", "web", "A title", "text", f"file:notes{gap}{pixel}"),))
               for gap in ("\n\n", "\r\n\r\n", "\r\r", "\n \t\n")]
    render = MarkdownIt("commonmark", {"html": True})
    for r in crafted:
        for panel in (cited_html(r, "s"), references_html(r, "s")):
            assert "\n" not in panel and "\r" not in panel
            assert render.render(panel) == panel, panel  # the Markdown pass hands the block over whole
            assert "<img" not in render.render(panel)
        assert f"<code>file:notes {pixel}</code>" in references_html(r, "s")  # a location shows on one line
    # the browser reads the same text back: the code block keeps its lines
    assert f"<code>quoted\n\n{pixel}\n</code>" in html.unescape(cited_html(crafted[0], "s"))
    assert one_line_html("<div>a\r\nb\rc\nd</div>") == "<div>a&#10;b&#10;c&#10;d</div>"


def test_follow_up_questions_carry_context_within_the_limit() -> None:
    earlier = [("Who was Haymo?", "An English Franciscan. " * 100), ("When did he die?", "In 1244.")]
    q = follow_up_question("Where did he study?", earlier, max_chars=8000)
    assert q.startswith("Where did he study?" + FOLLOW_UP_MARK)
    assert "Q: Who was Haymo?" in q and "A: In 1244." in q and len(q) < 8000
    assert typed_question(q) == "Where did he study?"
    short = follow_up_question("Where did he study?", earlier, max_chars=len("Where did he study?") + 60)
    assert short == "Where did he study?" + FOLLOW_UP_MARK + "\nQ: When did he die?\nA: In 1244."
    assert follow_up_question("Where?", earlier, max_chars=10) == "Where?"
    assert typed_question("plain question") == "plain question"
    # the report's title is what was typed, not the chat context
    assert build_report(trajectory(question=q, answer="He studied at Oxford.")).markdown.startswith(
        "# Where did he study?\n")


def test_the_citation_check_shows_under_the_answer_as_plain_rows() -> None:
    """Issue 48: a caption with the counts, and each checked sentence as a data-frame row (plain text, never
    rendered), numbered as the report's references; nothing for a report with nothing cited or never checked."""
    from agent.support import ClaimSupport, SupportCheck

    report = build_report(trajectory())
    sid = report.references[0].id
    check = SupportCheck((ClaimSupport("Books were translated into Latin.", (sid,), (sid,), 0.8, "supported"),
                          ClaimSupport("<img src=x onerror=alert(1)>", (sid,), (), 0.1, "unsupported")))
    checked = replace(report, support=check)
    caption = support_caption(checked)
    assert caption is not None and "1 supported" in caption and "1 unsupported" in caption
    assert support_rows(checked) == [
        {"sentence": "Books were translated into Latin.", "citation": "supported", "support": 0.8, "cites": "[1]"},
        {"sentence": "<img src=x onerror=alert(1)>", "citation": "unsupported", "support": 0.1, "cites": ""}]
    assert support_caption(replace(report, support=SupportCheck(()))) is None and support_caption(report) is None
    down = support_caption(replace(report, support=SupportCheck((), verified=False, note="the scorer is missing")))
    assert down is not None and down.startswith("Citations not verified (the scorer is missing)")
