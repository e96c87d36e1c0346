"""Invented ids and missing evidence are shown, not hidden (issue 64, item 6): a claim whose citation id no search
returned is marked unsupported and counted in the report, and a session whose searches all come back empty ends with
a report that says plainly that no evidence was found, and an answer that cites nothing says that it does.

Real parts: the graph, the local search (over the small index, or over an empty one), the session log, the service's
citation check with the offline MiniLM. Only the model is scripted (tests/fakes.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from agent.config import AgentConfig, RunOptions
from agent.deps import AgentDeps
from agent.report import NO_PASSAGES, NOTHING_CITED, NOTHING_SUPPORTED, verify_report
from agent.run import RunResult, execute, render_prompt
from agent.support import UNSUPPORTED_MARK
from agent.tools.ids import CounterCallIds
from agent.tools.local_search import LocalSearch
from app.export import doc_from_session, to_html, to_markdown
from app.service import ResearchService
from store.config import StoreConfig
from store.doc_index import DocIndex
from store.embeddings import embed_texts
from store.session_log import SessionLog
from tests.agent.scripts import SNIPPET_ID, calls_then_answer, stage_of, well_formed
from tests.fakes import ScriptedPolicy

QUESTION = "What language were books translated into in Haymo's era?"
OPTIONS = RunOptions(context_tokens=65536, question_first=False)  # the byte tokenizer spends one token per byte


def run(policy: ScriptedPolicy, tools: dict) -> RunResult:  # type: ignore[type-arg]
    """One session through the real graph (as tests/agent/test_graph.py runs it)."""
    deps = AgentDeps(policy=policy, tools=tools, options=OPTIONS, call_ids=CounterCallIds())

    async def go() -> RunResult:
        return await execute("s1", QUESTION, await render_prompt(QUESTION, deps), deps)

    return asyncio.run(go())


def test_an_invented_id_marks_its_claim_unsupported_and_is_counted_in_the_report(local_tools: dict) -> None:  # type: ignore[type-arg]
    result = run(ScriptedPolicy(well_formed(n_calls=1)), local_tools)  # cites a real snippet and "deadbeef-9"
    report = verify_report(result.report, result.trajectory, embed_texts)
    assert report.unknown_citations == 1
    # The claim stays, marked where its citation was; the invented id is nowhere in the report.
    assert f"an invented claim {UNSUPPORTED_MARK}." in report.body
    assert "deadbeef" not in report.markdown
    assert "Invented citation ids: 1 (no search in this session returned them)" in report.markdown
    # The claim that cited a retrieved passage is checked as before; the marked one is not a claim of the check.
    assert report.support is not None and [c.text for c in report.support.claims] == [
        "Books were translated into Latin."]


@pytest.fixture
def empty_search(tmp_path: Path) -> dict[str, LocalSearch]:
    """The real local search over a document index that holds nothing: every search comes back empty."""
    return {"local_search": LocalSearch(DocIndex(StoreConfig(data_dir=tmp_path / "index")), k=3)}


EMPTY_CALLS = [f'<call_tool name="local_search">Haymo of Faversham translation {n}</call_tool>' for n in range(2)]


@pytest.mark.parametrize("answer", [
    '<answer>Books were translated into <cite id="a1b2c3d4-0">Latin</cite>.</answer>',  # an id it never received
    "<answer>Books were probably translated into Latin.</answer>",  # no citation at all
])
def test_a_session_whose_searches_all_come_back_empty_says_no_evidence_was_found(
        empty_search: dict[str, LocalSearch], tmp_path: Path, answer: str) -> None:
    policy = ScriptedPolicy(calls_then_answer(EMPTY_CALLS, answer))
    log = SessionLog(tmp_path / "s.sqlite3")
    svc = ResearchService(policy, empty_search, log, AgentConfig(), embed=embed_texts)  # type: ignore[arg-type]
    out = asyncio.run(svc.run(QUESTION, OPTIONS))
    traj = out.trajectory
    assert len(traj.tool_calls) == 2 and all(c.error is None and not c.snippets for c in traj.tool_calls)
    report = out.report
    assert f"**{NO_PASSAGES}**" in report.markdown and NOTHING_SUPPORTED not in report.markdown
    assert report.references == () and "## References" not in report.markdown
    rec = log.get(out.session_id)
    assert rec.status == "completed" and rec.report == report.markdown  # the stored report says it too
    exported = to_markdown(doc_from_session(rec))  # and so does every export (the same lines in HTML and PDF)
    assert NO_PASSAGES in exported
    if "<cite" in answer:
        assert f"Latin {UNSUPPORTED_MARK}." in report.body and report.unknown_citations == 1
        assert rec.metrics["unknown_citations"] == 1 and "Invented citation ids: 1" in exported


def test_a_report_whose_every_citation_fails_the_check_says_no_passage_supports_it(local_tools: dict) -> None:  # type: ignore[type-arg]
    base = well_formed(n_calls=1, bogus_cite=False)

    def script(context: str, stop: Sequence[str]) -> str:  # cites a retrieved passage for what it does not say
        if stage_of(stop) != "answer":
            return base(context, stop)
        cited = SNIPPET_ID.findall(context)[0]
        return f'<answer>The moon is made of <cite id="{cited}">green cheese, first eaten in 1066</cite>.</answer>'

    result = run(ScriptedPolicy(script), local_tools)
    report = verify_report(result.report, result.trajectory, embed_texts)
    assert report.support is not None and [c.status for c in report.support.claims] == ["unsupported"]
    assert f"**{NOTHING_SUPPORTED}**" in report.markdown and NO_PASSAGES not in report.markdown
    assert report.unknown_citations == 0 and "Invented citation ids" not in report.markdown


HAYMO_CALL = ['<call_tool name="local_search">Haymo of Faversham translation</call_tool>']


@pytest.mark.parametrize(("answer", "shown"), [
    ("<answer>Purple elephants hum quietly at dawn.</answer>", True),  # cites nothing, and matches no passage
    ("<answer></answer>", False),  # no answer text: the report says that instead
])
def test_an_answer_that_cites_nothing_says_so_above_the_sources_it_consulted(
        local_tools: dict, tmp_path: Path, answer: str, shown: bool) -> None:  # type: ignore[type-arg]
    log = SessionLog(tmp_path / "s.sqlite3")
    svc = ResearchService(ScriptedPolicy(calls_then_answer(HAYMO_CALL, answer)), local_tools, log,  # type: ignore[arg-type]
                          AgentConfig(), embed=embed_texts)
    out = asyncio.run(svc.run(QUESTION, OPTIONS))
    report = out.report
    assert out.trajectory.snippets and report.unknown_citations == 0  # passages came back; nothing was invented
    assert report.references == () and not report.attributed  # and no sentence was matched to one after writing
    assert report.answer_found is shown
    assert "## Sources consulted (not cited in the text)" in report.markdown
    assert NO_PASSAGES not in report.markdown and NOTHING_SUPPORTED not in report.markdown
    assert (f"**{NOTHING_CITED}**" in report.markdown) is shown
    rec = log.get(out.session_id)
    assert rec.report == report.markdown  # the stored report says it too, and so does every export
    doc = doc_from_session(rec)
    assert (NOTHING_CITED in to_markdown(doc)) is shown and (NOTHING_CITED in to_html(doc)) is shown
