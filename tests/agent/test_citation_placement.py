"""Issue 64 with the real offline MiniLM: re-attribution only to a passage that passes the whole check (vetoes
included), citations kept where they were written, and every output saying what it is (the Markdown export escapes
claim text; a stored report without a check says "not verified"; odd input gets a clear status, never a crash)."""

from __future__ import annotations

from dataclasses import replace

from agent.report import build_report, report_fields, stored_report, verify_report
from agent.support import UNSUPPORTED_MARK, SupportCheck, check_support, support_sentence
from app.export import doc_from_session, to_markdown
from store.embeddings import embed_texts
from store.records import PromptRecord, SessionRecord, Snippet, ToolCallRecord, Trajectory, Turn

EINSTEIN = ("Albert Einstein", "Albert Einstein was born in Ulm, in the Kingdom of Württemberg, on 14 March 1879. "
            "He developed the theory of relativity.")
BOHR = ("Niels Bohr", "Niels Bohr was a Danish physicist who made foundational contributions to understanding atomic "
        "structure and quantum theory. He was born in Copenhagen in 1885.")
DELHI = ("Delhi", "Delhi has a hot semi-arid climate, with long and very hot summers from April to October and mild "
         "winters. The monsoon arrives at the end of June.")
HAYMO = ("Haymo of Faversham", "Haymo of Faversham (died 1244) was an English Franciscan friar and scholar, the "
         "fourth Minister General of the Franciscan order.")


def _snippets(*passages: tuple[str, str]) -> list[Snippet]:
    return [Snippet(id=f"p{n}-0", tool="local_search", title=t, text=x) for n, (t, x) in enumerate(passages, 1)]


def _turn(stage: str, kind: str, text: str) -> Turn:
    return Turn(stage=stage, kind=kind, text=text, token_ids=(1,))  # type: ignore[arg-type]


def _traj(answer: str, passages: tuple[tuple[str, str], ...]) -> Trajectory:
    turns, calls = [], []
    for sn in _snippets(*passages):
        turns += [_turn("research", "sampled", f'<call_tool name="local_search">{sn.title}</call_tool>'),
                  _turn("research", "tool_output",
                        f'<tool_output><snippet id="{sn.id}">{sn.text}</snippet></tool_output>')]
        calls.append(ToolCallRecord(tool="local_search", query=sn.title, snippets=(sn,)))
    turns += [_turn("answer", "forced", "<answer>"), _turn("answer", "sampled", answer + "</answer>")]
    return Trajectory(session_id="s1", question="What do the sources say?",
                      prompt=PromptRecord(text="q", token_ids=(1,), prompt_sha="p"), turns=tuple(turns),
                      tool_calls=tuple(calls))


def _record(traj: Trajectory, markdown: str, fields: dict[str, object] | None) -> SessionRecord:
    return SessionRecord(session_id="s1", question=traj.question, status="completed", created_at="t", finished_at="t",
                         policy_version="base", options={}, trajectory=traj, report=markdown,
                         metrics={"report": fields} if fields is not None else {})


# --- re-attribution -----------------------------------------------------------------------------------------------


def test_a_contradicting_passage_is_never_chosen_for_re_attribution() -> None:
    """The issue's case: a Munich claim cited to a Bohr passage is not moved to the Einstein passage saying Ulm."""
    traj = _traj('<cite id="p2-0">Einstein was born in Munich in 1879</cite>.', (EINSTEIN, BOHR))
    report = verify_report(build_report(traj), traj, embed_texts)
    assert report.support is not None
    (claim,) = report.support.claims
    assert claim.status == "unsupported" and claim.kept == () and claim.cited == ("p2-0",)
    assert report.body == f"Einstein was born in Munich in 1879 {UNSUPPORTED_MARK}."
    assert "re-attributed" not in report.markdown and "1 unsupported" in report.markdown
    assert "0 supported" in report.markdown


def test_re_attribution_still_moves_a_claim_to_the_passage_that_supports_it() -> None:
    traj = _traj('<cite id="p2-0">Einstein was born in Ulm in 1879</cite>.', (EINSTEIN, BOHR))
    report = verify_report(build_report(traj), traj, embed_texts)
    assert report.support is not None
    (claim,) = report.support.claims
    assert claim.status == "reattributed" and claim.kept == ("p1-0",) and claim.veto == ""
    assert report.body == "Einstein was born in Ulm in 1879 [1]."


def test_a_report_never_calls_a_contradicted_citation_supported() -> None:
    refs = _snippets(EINSTEIN)
    fixed = check_support("Einstein was not born in Ulm [1].", refs, refs, embed_texts)
    (claim,) = fixed.check.claims
    assert claim.status == "unsupported" and claim.veto
    sentence = support_sentence(fixed.check)
    assert sentence is not None and "0 supported" in sentence and "1 unsupported" in sentence


# --- claims stay where they were written --------------------------------------------------------------------------


def test_a_sentence_with_two_citations_keeps_both_in_place() -> None:
    refs = _snippets(DELHI, HAYMO)
    body = "Delhi has long and very hot summers [1], and Haymo of Faversham was an English Franciscan friar [2]."
    fixed = check_support(body, refs, refs, embed_texts)
    assert [c.status for c in fixed.check.claims] == ["supported", "supported"]
    assert fixed.body == body


def test_a_kept_citation_stays_after_its_clause_and_a_moved_one_is_replaced_where_it_was() -> None:
    refs = _snippets(DELHI, HAYMO)
    body = "Delhi has long and very hot summers [1], and Haymo of Faversham died in 1244 [1]."
    fixed = check_support(body, refs[:1], refs, embed_texts)
    assert [c.status for c in fixed.check.claims] == ["supported", "reattributed"]
    assert fixed.body == "Delhi has long and very hot summers [1], and Haymo of Faversham died in 1244 [2]."
    assert fixed.order == ("p1-0", "p2-0")


def test_an_unsupported_clause_is_marked_where_its_citation_was() -> None:
    refs = _snippets(DELHI, HAYMO)
    body = "Delhi has long and very hot summers [1] but the moon is made of green cheese [2]."
    fixed = check_support(body, refs, refs, embed_texts)
    assert [c.status for c in fixed.check.claims] == ["supported", "unsupported"]
    assert fixed.body == ("Delhi has long and very hot summers [1] but the moon is made of green cheese "
                          f"{UNSUPPORTED_MARK}.")


def test_one_group_citing_two_passages_keeps_the_supporting_ones_as_written() -> None:
    refs = _snippets(DELHI, HAYMO)
    fixed = check_support("Delhi has long and very hot summers [1][2].", refs, refs, embed_texts)
    (claim,) = fixed.check.claims
    assert claim.status == "supported" and claim.kept == ("p1-0",)
    assert fixed.body == "Delhi has long and very hot summers [1]."
    both = check_support("Haymo of Faversham died in 1244 and Delhi has very hot summers [1][2].", refs, refs,
                         embed_texts)
    assert both.body == "Haymo of Faversham died in 1244 and Delhi has very hot summers [1][2]."  # untouched


# --- every output says what it is ---------------------------------------------------------------------------------


def test_the_markdown_export_escapes_claim_text() -> None:
    hostile = "Delhi [x](javascript:alert(1)) has *very* hot <script>x</script> summers"
    traj = _traj(f'<cite id="p1-0">{hostile}</cite>.', (DELHI,))
    report = verify_report(build_report(traj), traj, embed_texts)
    md = to_markdown(doc_from_session(_record(traj, report.markdown, report_fields(report))))
    section = md.split("## Citation check", 1)[1]
    assert "<script>" not in section and "[x](" not in section and "*very*" not in section
    assert r"\<script\>" in section and r"\[x\](javascript" in section and r"\*very\*" in section


def test_a_stored_report_without_a_check_says_not_verified() -> None:
    traj = _traj('<cite id="p1-0">Delhi has very hot summers</cite>.', (DELHI,))
    plain = build_report(traj)  # as a session stored before the check, or with the check turned off
    for fields in (report_fields(plain), None):  # kept without a check; not kept at all (rebuilt from the trajectory)
        report = stored_report(_record(traj, plain.markdown, fields))
        assert report.support is not None and not report.support.verified and report.support.note
        assert "not verified" in report.markdown.lower()
        assert "Not verified" in to_markdown(doc_from_session(_record(traj, plain.markdown, fields)))
    checked = verify_report(plain, traj, embed_texts)
    damaged = report_fields(checked) | {"support": {"claims": [{"status": "x"}]}}
    report = stored_report(_record(traj, checked.markdown, damaged))
    assert report.support is not None and not report.support.verified and "not verified" in report.markdown.lower()


def test_a_stored_report_without_citations_has_nothing_to_verify() -> None:
    traj = _traj("Delhi is hot.", (DELHI,))
    plain = build_report(traj)
    assert stored_report(_record(traj, plain.markdown, report_fields(plain))).support is None


def test_claims_and_passages_with_markup_long_text_or_no_words_get_a_clear_status() -> None:
    refs = _snippets(DELHI, ("<b>Tags</b>", "<script>alert(1)</script> " + "word " * 5000), ("", ""))
    long_claim = "Delhi has very hot summers " + "and very hot summers " * 400
    body = f"<i>Delhi</i> has `very` hot **summers** [1].\n{long_claim}[1].\n$$$ !!! [2]\n\u2026 [3]\n| 1066 [1] |"
    fixed = check_support(body, refs, refs, embed_texts)
    statuses = [c.status for c in fixed.check.claims]
    assert statuses[:2] == ["supported", "supported"] and len(statuses) == 2
    assert fixed.check.unchecked == 3  # markers on no words: counted as not checked, kept as written
    sentence = support_sentence(fixed.check)
    assert sentence is not None and "3 more not checked" in sentence
    empty = check_support("", refs, refs, embed_texts)
    assert empty.body == "" and empty.check.claims == ()


def test_a_check_that_cannot_run_is_never_shown_as_supported() -> None:
    check = SupportCheck((), verified=False, note="the support scorer is unavailable")
    sentence = support_sentence(check)
    assert sentence is not None and "not verified" in sentence and "supported" not in sentence.replace(
        "not verified", "")
