"""Matched references for an uncited answer (agent.report.attribute_report) with the real offline MiniLM, and the
stored report round trip (stored_report gives back exactly the report the run produced)."""

from __future__ import annotations

from dataclasses import replace

from agent.report import (STORED_UNCHECKED, attribute_report, build_report, report_fields, stored_report,
                          unverified_report)
from agent.support import SupportCheck
from store.embeddings import embed_texts
from store.records import SessionRecord
from tests.judge.builders import trajectory

CRAB = ("The Crab Nebula is a supernova remnant and pulsar wind nebula in the constellation of Taurus. It was "
        "observed as a supernova by Chinese astronomers in 1054.")


def _traj(answer: str):  # type: ignore[no-untyped-def]
    return trajectory(question="What is the Crab Nebula?", answer=answer, queries=("Crab Nebula",),
                      tool_output_text=CRAB)


def test_a_restating_sentence_is_matched_and_an_unrelated_one_is_not() -> None:
    traj = _traj("The Crab Nebula is a supernova remnant in Taurus. I really like sunny weather and turtles.")
    plain = build_report(traj)
    assert plain.references == () and not plain.attributed
    report = attribute_report(plain, traj, embed_texts)
    assert report.attributed
    assert [s.id for s in report.references] == ["abcd0001-0"]
    assert report.body == "The Crab Nebula is a supernova remnant in Taurus. [1] I really like sunny weather and turtles."
    assert "## References" in report.markdown and "matched, after writing" in report.markdown
    assert "Sources consulted" not in report.markdown


def test_reports_that_cite_or_match_nothing_are_unchanged() -> None:
    cited = _traj('It is a <cite id="abcd0001-0">supernova remnant</cite>.')
    report = build_report(cited)
    assert attribute_report(report, cited, embed_texts) is report
    unrelated = _traj("I really like sunny weather and turtles. Bread is tasty.")
    report = build_report(unrelated)
    assert attribute_report(report, unrelated, embed_texts) is report
    no_answer = _traj("")
    report = build_report(no_answer)
    assert attribute_report(report, no_answer, embed_texts) is report


def test_stored_report_gives_back_the_report_the_run_kept() -> None:
    traj = _traj("The Crab Nebula is a supernova remnant in Taurus.")
    report = attribute_report(build_report(traj), traj, embed_texts)
    record = SessionRecord(session_id="s1", question=traj.question, status="completed", created_at="t",
                           finished_at="t", policy_version="base", options={}, trajectory=traj,
                           report=report.markdown, metrics={"report": report_fields(report)})
    # matched references that were never checked against their passages say so when served from storage (issue 64)
    assert stored_report(record) == unverified_report(report, traj, STORED_UNCHECKED)
    assert "Citations not verified" in stored_report(record).markdown
    checked = replace(report, support=SupportCheck(()))
    assert stored_report(replace(record, metrics={"report": report_fields(checked)})) == checked
    # sessions stored before reports were kept (or with ids that no longer resolve) are rebuilt from the trajectory
    assert stored_report(replace(record, metrics={})) == build_report(traj)
    broken = replace(record, metrics={"report": report_fields(report) | {"references": ["nope-0"]}})
    assert stored_report(broken) == build_report(traj)
    fields = report_fields(report)
    no_refs = replace(record, metrics={"report": {k: v for k, v in fields.items() if k != "references"}})
    assert stored_report(no_refs) == build_report(traj)  # a hand-edited or foreign row: rebuilt, no KeyError


def test_markup_debris_is_never_matched() -> None:
    traj = trajectory(question="q", answer='<referee_name="Local Hero" reference="Local Hero"/>',
                      queries=("Local Hero",), tool_output_text="Local Hero is a 1983 Scottish comedy-drama film.")
    report = build_report(traj)
    assert attribute_report(report, traj, embed_texts) is report
