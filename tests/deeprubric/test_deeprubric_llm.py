"""DeepRubric's LLM mode against the OpenAI chat-completions stand-in: exact malformed answers are repaired once,
then dropped and counted by reason; a whole scripted LLM build; `--mode llm` without an endpoint."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.cli import main
from learning.deeprubric.audit import validate_pair
from learning.deeprubric.build import AUDIT, PAIRS, TREES, BuildSettings, build, llm_components
from learning.deeprubric.corpus import SeedPage
from learning.deeprubric.llm import llm_steps
from learning.deeprubric.records import Node, Passage, Statement, Tree
from learning.deeprubric.synthesis import Skip
from learning.deeprubric.tree import TreeConfig, leaves
from learning.judge.client import JudgeClient
from learning.sft.generate import read_lines
from tests.judge.openai_standin import OpenAIStandIn

P1 = Passage("abcd0001-0", "Haymo of Faversham", "Haymo of Faversham (died 1244) was an English Franciscan. In 1240 "
             "he became minister general of the order.")
P2 = Passage("abcd0001-1", "Alexander of Hales", "Alexander of Hales (died 1245) was a Franciscan theologian at the "
             "University of Paris.")
NODE = Node("n0", "Haymo of Faversham", 0, None, "overview", "Haymo of Faversham")


@pytest.fixture
def standin() -> Iterator[OpenAIStandIn]:
    with OpenAIStandIn() as s:
        yield s


def client_of(standin: OpenAIStandIn) -> JudgeClient:
    return JudgeClient(standin.root, "standin-model", max_retries=0, backoff_s=0.01, backoff_max_s=0.02)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def repair_turn(standin: OpenAIStandIn, n: int = 1) -> str:
    """The repair message of the n-th request (its last user turn)."""
    return standin.chat_requests[n].json["messages"][-1]["content"]


# -- extraction: verbatim or dropped --------------------------------------------------------------------------------


def test_invalid_json_then_a_non_verbatim_statement_keeps_only_the_verbatim_one(standin: OpenAIStandIn) -> None:
    standin.push('{"statements": [{"text": "Haymo was')  # cut JSON
    standin.push(json.dumps({"statements": [
        {"text": "Haymo of Faversham (died 1244) was an English Franciscan.", "passage_id": "abcd0001-0"},
        {"text": "Haymo was a famous Dominican bishop.", "passage_id": "abcd0001-0"},  # not in any passage
    ]}))  # fmt: skip
    proposer, extractor, gate, synth, auditor, ledger = llm_steps(client_of(standin))
    got = run(extractor.extract(NODE, [P1, P2]))
    assert got == [Statement("Haymo of Faversham (died 1244) was an English Franciscan.", "abcd0001-0",
                             "Haymo of Faversham")]
    assert "not valid JSON" in repair_turn(standin)  # the repair names what was wrong
    counts = ledger.take()
    assert counts["requests"] == 2 and counts["steps"] == {"extract": 1} and counts["repaired"] == {}
    assert counts["failures"] == {"extract:not_verbatim": 1} and counts["dropped"] == {"extract:not_verbatim": 1}
    assert counts["prompt_tokens"] > 0 and counts["completion_tokens"] > 0
    assert ledger.take()["requests"] == 0  # take() starts again from zero


def test_a_non_verbatim_statement_is_named_in_the_repair_and_a_good_repair_is_kept(standin: OpenAIStandIn) -> None:
    standin.push(json.dumps({"statements": [{"text": "Haymo led the Franciscans from 1240.", "passage_id": "x"}]}))
    # The repair copies the text but names the wrong passage: the text is grounded in P2, so P2's id is kept.
    standin.push(json.dumps({"statements": [{"text": "Alexander of Hales (died 1245) was a Franciscan theologian",
                                             "passage_id": "abcd0001-0"}]}))
    _p, extractor, _g, _s, _a, ledger = llm_steps(client_of(standin))
    got = run(extractor.extract(NODE, [P1, P2]))
    assert got == [Statement("Alexander of Hales (died 1245) was a Franciscan theologian", "abcd0001-1",
                             "Alexander of Hales")]
    assert "'Haymo led the Franciscans from 1240.'" in repair_turn(standin)
    assert "not a verbatim piece" in repair_turn(standin)
    counts = ledger.take()
    assert counts["repaired"] == {"extract": 1} and counts["failures"] == {} and counts["dropped"] == {}


def test_proposals_breaking_the_sibling_rules_go_to_the_tree_builder_after_one_repair(standin: OpenAIStandIn) -> None:
    bad = {"sub_queries": [{"query": q, "facet": "timeline", "focus": "Haymo", "contrast": ""}
                           for q in ("Haymo history", "Haymo history", "Haymo early life and education")]}
    standin.push(json.dumps(bad), times=2)
    proposer, _e, gate, _s, _a, ledger = llm_steps(client_of(standin))
    got = run(proposer.propose(NODE, [], 3, frozenset()))
    assert [p.query for p in got] == ["Haymo history", "Haymo history", "Haymo early life and education"]
    text = repair_turn(standin)
    assert "duplicate: 'Haymo history'" in text and "missing facet: comparison" in text
    assert ledger.take()["failures"] == {"propose:check_children": 1}
    standin.push("not json at all", times=2)  # the gate: invalid twice, so branching goes on (counted)
    assert run(gate.expand(NODE, [])) is True
    assert ledger.take()["failures"] == {"gate:invalid_json": 1}


# -- synthesis and audit --------------------------------------------------------------------------------------------

S = ["Haymo of Faversham (died 1244) was an English Franciscan.",
     "Alexander of Hales (died 1245) was a Franciscan theologian at the University of Paris.",
     "In 1240 he became minister general of the order."]  # fmt: skip


def small_tree() -> Tree:
    titles = ["Haymo of Faversham", "Alexander of Hales", "Haymo of Faversham"]
    nodes = [Node("n0", "Haymo of Faversham", 0, None, "overview", "Haymo of Faversham", children=("n1", "n2", "n3"))]
    for i, (q, facet) in enumerate([("Haymo compared with Hales", "comparison"), ("Haymo risks", "risks"),
                                    ("Haymo key figures", "quantitative")], 1):
        nodes.append(Node(f"n{i}", q, 1, "n0", facet, titles[i - 1] if i < 3 else "Franciscan order", statements=(
            Statement(S[i - 1], f"abcd000{i}-0", titles[i - 1]),), stop="max_depth"))
    return Tree("t-1", "s0-0", "llm", "Haymo of Faversham", "", (), tuple(nodes))


def rubric(i: int, kind: str, leaf: str, evidence: list[str] | None = None, weight: float = 0.8) -> dict[str, Any]:
    return {"id": f"R{i}", "type": kind, "description": f"Checks point number {i} of the answer", "weight": weight,
            "source_leaf_ids": [leaf], "evidence": evidence or []}


def rubrics(leaf_ids: list[str], n: int = 5) -> list[dict[str, Any]]:
    out = [rubric(i + 1, "factual", leaf, [S[i]]) for i, leaf in enumerate(leaf_ids)]
    out += [rubric(len(out) + i + 1, "logical", leaf_ids[0]) for i in range(n - len(out))]
    return out


def synthesis(rubs: list[dict[str, Any]], selected: tuple[str, ...] = ("n1", "n2", "n3")) -> str:
    return json.dumps({
        "selected_leaf_ids": list(selected),
        "selection_trace": [{"leaf_id": x, "chosen": True, "reason": "distinct facet"} for x in selected],
        "merge_trace": [{"id": "M1", "level": 1, "sources": list(selected), "query": "Haymo's career"}],
        "question": "How did Haymo of Faversham's career compare with Alexander of Hales's?", "rubrics": rubs,
    })  # fmt: skip


def test_a_rubric_citing_a_leaf_outside_the_selection_is_repaired_once_then_the_tree_is_skipped(
    standin: OpenAIStandIn,
) -> None:
    bad = rubrics(["n1", "n2", "n3"])
    bad[3]["source_leaf_ids"] = ["n0"]  # the root is no selected leaf
    standin.push(synthesis(bad), times=2)
    _p, _e, _g, synth, _a, ledger = llm_steps(client_of(standin))
    tree = small_tree()
    with pytest.raises(Skip) as skip:
        run(synth.synthesise(tree, leaves(tree)))
    assert skip.value.reason == "synthesis_invalid:leaf_outside_selection"
    assert "rubric 4 (R4): cites ['n0'], outside the selected leaves" in repair_turn(standin)
    assert ledger.take()["failures"] == {"synthesise:leaf_outside_selection": 1}


def test_too_few_rubrics_are_repaired_and_the_pair_is_well_formed(standin: OpenAIStandIn) -> None:
    standin.push(synthesis(rubrics(["n1", "n2", "n3"], 5)[:3]))  # three rubrics
    good = rubrics(["n1", "n2", "n3"], 6)
    good[0]["evidence"] = ["  Haymo of Faversham (died 1244)   was an English Franciscan"]  # a verbatim piece
    standin.push(synthesis(good))
    _p, _e, _g, synth, _a, ledger = llm_steps(client_of(standin))
    tree = small_tree()
    pair = run(synth.synthesise(tree, leaves(tree)))
    assert "3 rubrics; write 5 to 8" in repair_turn(standin)
    assert pair.mode == "llm" and pair.selected_leaf_ids == ("n1", "n2", "n3") and len(pair.rubrics) == 6
    assert pair.rubrics[0].evidence == (S[0],)  # stored as the whole leaf statement
    assert [m.id for m in pair.merge_trace] == ["M1", "Q"] and pair.merge_trace[-1].query == pair.question
    assert {s.leaf_id for s in pair.selection_trace if s.chosen} == {"n1", "n2", "n3"}
    assert validate_pair(pair) == []
    assert ledger.take()["repaired"] == {"synthesise": 1}


def test_audit_revise_with_too_few_rubrics_is_dropped_and_a_good_revise_replaces_the_pair(
    standin: OpenAIStandIn,
) -> None:
    standin.push(synthesis(rubrics(["n1", "n2", "n3"])))
    _p, _e, _g, synth, auditor, ledger = llm_steps(client_of(standin))
    tree = small_tree()
    pair = run(synth.synthesise(tree, leaves(tree)))

    def verdict(decision: str, rubs: list[dict[str, Any]], question: str = "A repaired question?") -> str:
        return json.dumps({"decision": decision, "drop_reason": "none", "problems": [
            {"dimension": "scoring", "rubric_id": "R5", "message": "weight too high"}],
            "revised_question": question, "revised_rubrics": rubs})

    standin.push(verdict("REVISE", rubrics(["n1", "n2"], 4)), times=2)  # 4 rubrics, twice
    dropped = run(auditor.audit(pair))
    assert (dropped.decision, dropped.reason, dropped.revised) == ("DROP", "audit_invalid:too_few_rubrics", None)
    assert "4 rubrics; write 5 to 8" in repair_turn(standin, 2)

    standin.push(verdict("REVISE", rubrics(["n1", "n2", "n3"], 7)))
    revised = run(auditor.audit(pair))
    assert revised.decision == "REVISE" and revised.revised is not None
    assert revised.revised.question == "A repaired question?" and len(revised.revised.rubrics) == 7
    assert revised.revised.merge_trace[-1].query == "A repaired question?" and validate_pair(revised.revised) == []
    assert revised.problems[0].dimension == "scoring"
    standin.push(verdict("DROP", []).replace('"none"', '"deep_research"'))
    assert run(auditor.audit(pair)).reason == "deep_research"
    counts = ledger.take()
    assert counts["steps"] == {"synthesise": 1, "audit": 3}
    assert counts["failures"] == {"audit:too_few_rubrics": 1} and counts["requests"] == 5


def test_an_unavailable_endpoint_fails_each_step_without_crashing(standin: OpenAIStandIn) -> None:
    standin.push(status=503, times=20)
    _p, extractor, gate, synth, auditor, ledger = llm_steps(client_of(standin))
    tree = small_tree()
    assert run(extractor.extract(NODE, [P1])) == []
    assert run(gate.expand(NODE, [])) is True
    with pytest.raises(Skip, match="synthesis_unavailable"):
        run(synth.synthesise(tree, leaves(tree)))
    assert ledger.take()["failures"] == {"extract:unavailable": 1, "gate:unavailable": 1,
                                         "synthesise:unavailable": 1}


# -- a whole scripted build ------------------------------------------------------------------------------------------


class FixedRetriever:
    """A Retriever with one made-up passage per query (distinct text, so no statement repeats another)."""

    async def __call__(self, query: str) -> list[Passage]:
        h = hashlib.sha256(query.encode()).hexdigest()
        year = 1100 + int(h[:4], 16) % 800
        text = (f"The chronicle on {query} was compiled in {year} by the archivists of the abbey. "
                f"It was copied again in {year + 40} for the cathedral library.")
        return [Passage(f"{h[:8]}-0", query, text)]


SEED = SeedPage("Haymo of Faversham", "Haymo of Faversham was an English Franciscan. He studied in Paris.", "demo")
_PASSAGE = re.compile(r'<passage id="([^"]+)" title="[^"]*">\n(.*?\.)', re.S)
_LEAF = re.compile(r"^\[(n\d+)\].*\n  - (.*)$", re.M)


def scripted(request: dict[str, Any]) -> str:
    """A well-behaved LLM: first sentences as statements, three faceted sub-queries, all leaves, KEEP."""
    name = request["response_format"]["json_schema"]["name"]
    prompt = request["messages"][-1]["content"]
    if name == "deeprubric_extract":
        return json.dumps({"statements": [{"text": t, "passage_id": i} for i, t in _PASSAGE.findall(prompt)]})
    if name == "deeprubric_gate":
        return json.dumps({"expand": True, "reason": "new facets"})
    if name == "deeprubric_propose":
        return json.dumps({"sub_queries": [
            {"query": "Haymo compared with Bonaventure", "facet": "comparison", "focus": "Haymo",
             "contrast": "Bonaventure"},
            {"query": "Haymo risks and failures", "facet": "risks", "focus": "Haymo", "contrast": ""},
            {"query": "Haymo key figures and statistics", "facet": "quantitative", "focus": "Haymo",
             "contrast": ""}]})  # fmt: skip
    if name == "deeprubric_synthesise":
        found = _LEAF.findall(prompt)
        ids = [i for i, _ in found]
        rubs = [rubric(n + 1, "factual", i, [t]) for n, (i, t) in enumerate(found)]
        rubs += [rubric(len(rubs) + 1, "logical", ids[0]), rubric(len(rubs) + 2, "logical", ids[1])]
        return json.dumps({"selected_leaf_ids": ids, "selection_trace": [], "merge_trace": [
            {"id": "M1", "level": 1, "sources": ids, "query": "Haymo's records"}],
            "question": "What do the abbey records show about Haymo of Faversham?", "rubrics": rubs})
    assert name == "deeprubric_audit"
    return json.dumps({"decision": "KEEP", "drop_reason": "none", "problems": [], "revised_question": "",
                       "revised_rubrics": []})


def build_one_tree(out: Path, client: JudgeClient, settings: BuildSettings, components: Any) -> Any:
    """Build the SEED tree (its pair and audit) into `out` with these LLM components, then close the client."""

    async def go() -> Any:
        try:
            return await build(out, [("s0-0", SEED)], lambda _k: FixedRetriever(), settings, components)
        finally:
            await client.aclose()

    return run(go())


def test_a_scripted_llm_build_writes_labelled_pairs_and_counts_every_request(
    standin: OpenAIStandIn, tmp_path: Path
) -> None:
    standin.responder = scripted
    client = client_of(standin)
    config = TreeConfig(max_depth=1, children=(3,), max_nodes=4, top_k=1, passage_chars=600)
    components = llm_components(client, temperature=0.0)
    settings = BuildSettings("llm", 0, None, config, "standin-model")
    result = build_one_tree(tmp_path, client, settings, components)
    (tree,), (audit,) = read_lines(tmp_path / TREES), read_lines(tmp_path / AUDIT)
    (pair,) = read_lines(tmp_path / PAIRS)
    assert tree["mode"] == pair["mode"] == audit["mode"] == "llm"
    assert tree["model"] == pair["model"] == audit["model"] == "standin-model"
    assert len(tree["tree"]["nodes"]) == 4 and len(tree["leaves"]) == 3 and audit["decision"] == "KEEP"
    assert len(pair["rubrics"]) == 5 and pair["selected_leaf_ids"] == ["n1", "n2", "n3"]
    llm = result.stats["llm"]
    assert llm["models"] == ["standin-model"] and llm["requests"] == len(standin.chat_requests) == 8
    assert llm["steps"] == {"audit": 1, "extract": 4, "gate": 1, "propose": 1, "synthesise": 1}
    assert llm["failures"] == {} and llm["prompt_tokens"] > 0
    assert "LLM step failures after repair, by reason | none" in (tmp_path / "stats.md").read_text()
    with pytest.raises(ValueError, match="do not match"):  # offline components cannot continue an LLM folder
        run(build(tmp_path, [], lambda _k: FixedRetriever(), settings))


def test_mode_llm_without_an_endpoint_exits_2_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("RUBRICEM_LEARNING__JUDGE__BASE_URL", raising=False)
    out = tmp_path / "build"
    assert main(["deeprubric", "build", "--seeds", "1", "--out", str(out), "--mode", "llm"]) == 2
    assert "--mode llm needs an LLM endpoint" in capsys.readouterr().err
    assert not out.exists()


# -- end to end with a real model ------------------------------------------------------------------------------------


# Both tests ask at temperature 0 (greedy; grammar-constrained JSON), so the model's answers are the same on every run
# on one machine, and each test pins the outcome those answers must give (issue 61: they used to accept every
# outcome). Measured 2026-12 on this project's Xeon VMs (AVX-512; the llama.cpp that `make install` builds), the same
# in repeated runs (the second test also run alone). If another CPU variant or llama.cpp release changes the greedy answers, the
# assertion messages carry the counts: measure again and pin the new outcome with its reading.


@pytest.mark.slow
def test_llm_build_served_by_llamacpp_runs_to_the_end(tmp_path: Path, llamacpp_server: str) -> None:
    """SmolLM2-135M behind the llama-cpp-python server, one tree, tiny budget (~20 s).

    What the model does: asked for the root's statements, it copies the passage's first sentence, then breaks the
    second statement's `passage_id` string open, and answers the repair the same way. The client recovers only the
    first statement's object, which lacks `statements`: an `extract:schema` failure after the one repair, nothing
    salvaged or dropped. So the root keeps no statement and is a leaf ("gate": no new evidence, so neither the gate nor
    the proposer is asked), and one leaf without statements gives no pair (SKIP too_few_leaves) and no synthesis call.
    A pipeline that skipped the repair, kept an unparsed answer, branched without evidence or synthesised from an empty
    tree would show other counts. (Synthesis and audit with this model: the next test.)"""
    client = JudgeClient(llamacpp_server, "smollm2", json_mode="json_object", max_tokens=256, timeout_s=120,
                         max_retries=1)
    config = TreeConfig(max_depth=1, children=(3,), max_nodes=4, top_k=1, passage_chars=600, statements_per_node=2)
    components = llm_components(client, temperature=0.0, statements_per_node=2)
    settings = BuildSettings("llm", 0, None, config, "smollm2")
    result = build_one_tree(tmp_path, client, settings, components)
    (tree,), (audit,) = read_lines(tmp_path / TREES), read_lines(tmp_path / AUDIT)
    pairs = read_lines(tmp_path / PAIRS)
    llm = result.stats["llm"]
    assert tree["mode"] == audit["mode"] == "llm" and tree["model"] == audit["model"] == "smollm2"
    got = {k: llm[k] for k in ("requests", "steps", "repaired")}
    assert got == {"requests": 2, "steps": {"extract": 1}, "repaired": {}}, llm  # the answer and its one repair
    # Both unusable, counted under the extract step. Why they are unusable depends on the greedy tokens, which differ
    # between CPU variants and llama.cpp releases: measured `extract:schema` (2026-12, this Xeon) and, on an earlier
    # machine, `extract:not_verbatim`. Either way the outcome below is the same.
    reasons = {**llm["failures"], **llm["dropped"]}
    assert reasons and set(reasons) <= {"extract:schema", "extract:not_verbatim"}, llm
    assert llm["completion_tokens"] > 0
    (root,) = tree["tree"]["nodes"]  # no children were proposed
    assert (root["id"], root["stop"], root["statements"], root["children"]) == ("n0", "gate", [], []), root
    assert [p["title"] for p in root["passages"]] == ["Haymo of Faversham"]  # it did retrieve (top_k 1)
    assert [x["id"] for x in tree["leaves"]] == ["n0"]
    assert (audit["decision"], audit["reason"]) == ("SKIP", "too_few_leaves") and pairs == []
    assert audit["llm"]["requests"] == 0  # the skip is decided before any synthesis request
    stats = (tmp_path / "stats.md").read_text()
    assert "trees without a pair, by reason | too_few_leaves 1" in stats
    assert "LLM step failures after repair, by reason | extract:" in stats or llm["dropped"], stats


@pytest.mark.slow
def test_synthesis_and_audit_served_by_llamacpp_end_with_a_defined_outcome(llamacpp_server: str,
                                                                            standin: OpenAIStandIn) -> None:
    """The two pair-making steps with the real model (the tree test above never reaches them: its tree has no
    statements), 1-2 minutes on a busy 2-core machine. Synthesis on the hand-made tree, then an audit of a
    well-formed pair (made by the stand-in, so the audit runs whatever the synthesis gave).

    What the model does: its synthesis selects no leaf (`"selected_leaf_ids": []`), in the answer and in the repair,
    so the tree gives no pair: `synthesis_invalid:selection_size`. Its audit answers run past the 384-token budget
    (cut-off JSON, twice); the client recovers only an inner object without the required keys, so the pair is
    dropped for `audit_invalid:schema`, with no problems and no revision taken from the broken answer. Each step sent
    exactly one repair request."""
    client = JudgeClient(llamacpp_server, "smollm2", json_mode="json_object", max_tokens=384, timeout_s=120,
                         max_retries=1)
    _p, _e, _g, synth, auditor, ledger = llm_steps(client, temperature=0.0)
    tree = small_tree()
    standin.push(synthesis(rubrics(["n1", "n2", "n3"])))
    _sp, _se, _sg, scripted_synth, _sa, _sl = llm_steps(client_of(standin))
    good = run(scripted_synth.synthesise(tree, leaves(tree)))
    assert validate_pair(good) == []

    async def go() -> tuple[Any, Any]:
        try:
            try:
                made = await synth.synthesise(tree, leaves(tree))
            except Skip as skip:
                made = skip
            return made, await auditor.audit(good)
        finally:
            await client.aclose()

    made, verdict = run(go())
    counts = ledger.take()
    assert isinstance(made, Skip) and made.reason == "synthesis_invalid:selection_size", made
    assert (verdict.decision, verdict.reason, verdict.problems, verdict.revised) == (
        "DROP", "audit_invalid:schema", (), None), verdict
    got = {k: counts[k] for k in ("requests", "steps", "repaired", "failures", "dropped")}
    assert got == {"requests": 4, "steps": {"synthesise": 1, "audit": 1}, "repaired": {},
                   "failures": {"synthesise:selection_size": 1, "audit:schema": 1}, "dropped": {}}, counts
    assert counts["completion_tokens"] > 0
