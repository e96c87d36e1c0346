"""Verified citations (issue 48, agent/support.py and agent/report.verify_report) with the real offline MiniLM: a claim
and its true passage (kept), a swapped citation (re-attributed), an invented claim (uncited, marked), an id that was
never retrieved (removed, never shown), an empty answer, lists and tables, a very long answer, and the scorer
unavailable (shown unverified). Plus the stored round trip and the session record the service writes."""

from __future__ import annotations

import re
from dataclasses import replace
from functools import partial

import pytest

from agent.report import build_report, report_fields, stored_report, unverified_report, verify_report
from agent.support import MAX_CLAIMS, SUPPORT_MIN, UNSUPPORTED_MARK, check_support, content_words, support_matrix
from store.embeddings import embed_texts
from store.records import PromptRecord, SessionRecord, Snippet, ToolCallRecord, Trajectory, Turn

DELHI = ("Delhi", "Delhi has a hot semi-arid climate, with long and very hot summers from April to October and mild "
         "winters. The monsoon arrives at the end of June.")
HAYMO = ("Haymo of Faversham", "Haymo of Faversham (died 1244) was an English Franciscan friar and scholar, the "
         "fourth Minister General of the Franciscan order.")
POTTER = ("Harry Potter in translation", "The Harry Potter books have been translated into more than 80 languages, "
          "among them Latin and Ancient Greek.")


def _turn(stage: str, kind: str, text: str) -> Turn:
    return Turn(stage=stage, kind=kind, text=text, token_ids=(1,))  # type: ignore[arg-type]


def _traj(answer: str, passages: tuple[tuple[str, str], ...] = (DELHI, HAYMO, POTTER)) -> Trajectory:
    """A session that retrieved `passages` (ids p1-0, p2-0, ...) and answered `answer`."""
    turns, calls = [], []
    for n, (title, text) in enumerate(passages, 1):
        sn = Snippet(id=f"p{n}-0", tool="local_search", title=title, text=text)
        turns += [_turn("research", "sampled", f'<call_tool name="local_search">{title}</call_tool>'),
                  _turn("research", "tool_output", f'<tool_output><snippet id="p{n}-0">{text}</snippet></tool_output>')]
        calls.append(ToolCallRecord(tool="local_search", query=title, snippets=(sn,)))
    turns += [_turn("answer", "forced", "<answer>"), _turn("answer", "sampled", answer + "</answer>")]
    return Trajectory(session_id="s1", question="What do the sources say?",
                      prompt=PromptRecord(text="q", token_ids=(1,), prompt_sha="p"), turns=tuple(turns),
                      tool_calls=tuple(calls))


def _verified(answer: str):  # type: ignore[no-untyped-def]
    traj = _traj(answer)
    return traj, verify_report(build_report(traj), traj, embed_texts)


def test_a_claim_and_its_true_passage_are_kept() -> None:
    traj, report = _verified('<cite id="p1-0">Delhi has a hot semi-arid climate with long, very hot summers</cite>.')
    assert report.support is not None and report.support.verified
    (claim,) = report.support.claims
    assert claim.status == "supported" and claim.cited == claim.kept == ("p1-0",) and claim.score >= SUPPORT_MIN
    assert report.body == "Delhi has a hot semi-arid climate with long, very hot summers [1]."
    assert report.raw_body == "" and [s.id for s in report.references] == ["p1-0"]
    assert "checked against their passages: 1 supported._" in report.markdown
    assert UNSUPPORTED_MARK not in report.markdown


def test_a_swapped_citation_is_re_attributed_to_the_passage_that_supports_it() -> None:
    traj, report = _verified('<cite id="p1-0">Haymo of Faversham was an English Franciscan friar</cite>. '
                             '<cite id="p1-0">The monsoon reaches Delhi at the end of June</cite>.')
    assert report.support is not None
    first, second = report.support.claims
    assert first.status == "reattributed" and first.cited == ("p1-0",) and first.kept == ("p2-0",)
    assert second.status == "supported" and second.kept == ("p1-0",)
    # renumbered in order of first use: Haymo is [1] now, Delhi [2]
    assert report.body == ("Haymo of Faversham was an English Franciscan friar [1]. "
                           "The monsoon reaches Delhi at the end of June [2].")
    assert [s.id for s in report.references] == ["p2-0", "p1-0"]
    assert report.raw_body == ("Haymo of Faversham was an English Franciscan friar [1]. "
                               "The monsoon reaches Delhi at the end of June [1].")
    refs = report.markdown.split("## References")[1]
    assert refs.index("Haymo of Faversham") < refs.index("Delhi")


def test_an_invented_claim_loses_its_citation_and_is_marked_and_no_passage_is_added() -> None:
    traj, report = _verified('<cite id="p1-0">The moon is made of green cheese and was first eaten in 1066</cite>.')
    assert report.support is not None
    (claim,) = report.support.claims
    assert claim.status == "unsupported" and claim.kept == () and claim.cited == ("p1-0",)
    assert report.body == f"The moon is made of green cheese and was first eaten in 1066 {UNSUPPORTED_MARK}."
    assert report.references == ()  # nothing cited any more: the passages are listed as consulted, not cited
    assert "Sources consulted (not cited in the text)" in report.markdown and "1 unsupported" in report.markdown
    assert set(s.id for s in _traj("").snippets.values()) >= {"p1-0"}  # only retrieved passages ever appear


def test_an_id_never_retrieved_is_removed_and_never_shown() -> None:
    traj, report = _verified('<cite id="zz99-0">Delhi has hot summers</cite> and '
                             '<cite id="p1-0,zz98-1">mild winters</cite>.')
    assert report.unknown_citations == 2 and "zz99" not in report.markdown and "zz98" not in report.markdown
    fixed = check_support("Delhi has hot summers [1]. Snow falls daily [7].", report.references,
                          list(traj.snippets.values()), embed_texts)
    assert "[7]" not in fixed.body and "Snow falls daily." in fixed.body  # a number no reference has: removed
    assert [c.text for c in fixed.check.claims] == ["Delhi has hot summers."]


def test_an_empty_answer_and_an_answer_without_citations_are_verified_as_they_are() -> None:
    for answer in ("", "Delhi is hot."):
        traj = _traj(answer)
        report = build_report(traj)
        checked = verify_report(report, traj, embed_texts)
        assert checked.support is not None and checked.support.verified and checked.support.claims == ()
        assert checked.body == report.body and checked.markdown == report.markdown


def test_claims_in_lists_and_tables_are_checked_and_no_text_is_lost() -> None:
    answer = ('Findings:\n- <cite id="p2-0">Haymo of Faversham was a Franciscan friar</cite>\n'
              '- <cite id="p2-0">Delhi summers are long and very hot</cite>\n\n'
              '| City | Climate |\n|---|---|\n| Delhi | <cite id="p3-0">hot semi-arid</cite> |\n'
              'In Delhi <cite id="p1-0">the monsoon arrives at the end of June</cite>')  # no sentence end
    traj, report = _verified(answer)
    assert report.support is not None
    statuses = [c.status for c in report.support.claims]
    assert statuses == ["supported", "reattributed", "reattributed", "supported"], report.support.claims
    words = lambda s: re.findall(r"[A-Za-z]+", re.sub(r"\[\d+\]|\*\(unsupported\)\*", "", s))  # noqa: E731
    assert words(report.body) == words(report.raw_body)  # every word kept, in order
    assert any(ln.startswith("| Delhi | hot semi-arid [") and ln.endswith("] |") for ln in report.body.splitlines())


def test_a_very_long_answer_checks_the_first_claims_and_keeps_the_rest_as_written() -> None:
    traj = _traj("x")
    refs = (traj.snippets["p1-0"],)
    body = " ".join("Delhi has very hot summers [1]." for _ in range(MAX_CLAIMS + 5))  # no number the passage lacks
    fixed = check_support(body, refs, list(traj.snippets.values()), embed_texts)
    assert len(fixed.check.claims) == MAX_CLAIMS and fixed.check.unchecked == 5
    assert fixed.body.count("[1]") == MAX_CLAIMS + 5


def test_the_scorer_unavailable_shows_the_report_unverified() -> None:
    traj = _traj('<cite id="p1-0">Delhi has hot summers</cite>.')
    report = build_report(traj)
    missing = partial(embed_texts, model_name="/nonexistent/minilm")  # the embedding model is not there
    with pytest.raises(Exception):  # noqa: B017 - whatever the loader raises; the service turns it into this:
        verify_report(report, traj, missing)
    shown = unverified_report(report, traj, "the support scorer is unavailable")
    assert shown.body == report.body and shown.references == report.references
    assert shown.support is not None and not shown.support.verified
    assert "Citations not verified (the support scorer is unavailable)" in shown.markdown


def test_the_stored_report_keeps_the_check_and_the_body_as_written() -> None:
    traj, report = _verified('<cite id="p1-0">Haymo of Faversham was an English Franciscan friar</cite>.')
    record = SessionRecord(session_id="s1", question=traj.question, status="completed", created_at="t",
                           finished_at="t", policy_version="base", options={}, trajectory=traj,
                           report=report.markdown, metrics={"report": report_fields(report)})
    assert stored_report(record) == report and report.raw_body
    damaged = replace(record, metrics={"report": report_fields(report) | {"support": {"claims": [{"status": "x"}]}}})
    shown = stored_report(damaged)  # an unreadable check is dropped, the report still shows, and says it is unchecked
    assert shown.support is not None and not shown.support.verified and shown.body == report.body
    assert "Citations not verified" in shown.markdown


def test_support_reads_words_and_meaning() -> None:
    assert content_words("The answer is Delhi, founded in 1911 by the British.") == {"delhi", "found", "1911",
                                                                                      "briti"}
    passages = [Snippet("a", "t", *DELHI), Snippet("b", "t", *HAYMO)]
    m = support_matrix(["Delhi's summers are very hot.", "Haymo died in 1244."], passages, embed_texts)
    assert m.shape == (2, 2) and m[0, 0] > m[0, 1] and m[1, 1] > m[1, 0]
