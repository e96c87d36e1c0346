"""DeepRubric's pure parts with hand-made inputs: text, facets, offline proposer/extractor, tree rules, selection,
synthesis, audit and statistics."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace

from learning.deeprubric.audit import audit_pair, find_problems, validate_pair
from learning.deeprubric.facets import check_children, facet_of
from learning.deeprubric.offline import (
    OfflineExtractor,
    OfflineProposer,
    candidate_entities,
    offline_statements,
    page_root,
    propose_children,
)
from learning.deeprubric.records import (
    Leaf,
    Node,
    Passage,
    Rubric,
    Statement,
    Tree,
    pair_from_json,
    to_json,
    tree_from_json,
)
from learning.deeprubric.select import select_leaves
from learning.deeprubric.stats import compute_stats
from learning.deeprubric.synthesis import Skip, merge, synthesise_offline, write_rubrics
from learning.deeprubric.text import entity_spans, is_duplicate, sentences, trim_statement
from learning.deeprubric.tree import AlwaysExpand, Proposal, TreeConfig, build_tree, leaves, repair_children

HAYMO = ("Haymo of Faversham (died 1244) was an English Franciscan. He studied at the University of Paris under "
         "Alexander of Hales. In 1240 he became minister general of the order. St. Bonaventure praised him.")
HALES = "Alexander of Hales (died 1245) was a Franciscan theologian at the University of Paris."


# -- text and facets ---------------------------------------------------------------------------------------------------


def test_sentences_entities_and_trimming_are_verbatim() -> None:
    assert sentences(HAYMO) == [
        "Haymo of Faversham (died 1244) was an English Franciscan.",
        "He studied at the University of Paris under Alexander of Hales.",
        "In 1240 he became minister general of the order.",
        "St. Bonaventure praised him.",  # "St." is an abbreviation, not a sentence end
    ]
    assert entity_spans(HAYMO) == ["Haymo of Faversham", "English Franciscan", "University of Paris",
                                   "Alexander of Hales", "St Bonaventure"]
    head = ("The abbey was founded in 1100 by monks who came from Cluny; they were given wide lands, mills and "
            "fisheries along the river by the count of the valley")
    long = head + ", " + "rebuilt " * 20 + "and finally closed in 1540 by the crown."
    assert len(head) > 120 and len(long) > 240
    assert trim_statement(long) == head  # cut at the last clause boundary within 240 characters, no ellipsis
    assert trim_statement("x" * 100 + ", " + "y" * 200) is None  # the only boundary leaves too little
    assert trim_statement("Too short.") is None
    assert is_duplicate("Haymo of Faversham was an English Franciscan.", ["haymo of faversham was an English "
                                                                          "franciscan"])
    assert not is_duplicate("Haymo studied in Paris.", ["Haymo died in 1244."])


def test_check_children_names_every_violation() -> None:
    good = ["Haymo compared with Alexander of Hales", "Haymo risks, failures and criticism",
            "Haymo key figures and statistics"]
    assert check_children(good, ["Haymo"]) == []
    assert [facet_of(q) for q in good] == ["comparison", "risks", "quantitative"]
    bad = ["Haymo history and timeline", "Haymo history and timeline", "a b c d e f g h i j k l"]
    assert check_children(bad, ["Haymo"]) == [
        "duplicate: 'Haymo history and timeline'",
        "too long (12 tokens): 'a b c d e f g h i j k l'",
        "missing facet: comparison",
        "missing facet: risks",
        "missing facet: quantitative",
    ]
    assert check_children(["Haymo"], ["Haymo"]) == ["duplicate: 'Haymo'"]  # repeats an ancestor


def test_repair_children_keeps_what_passes_and_counts_the_rest() -> None:
    props = [Proposal("A compared with B", "comparison", "A", "B"), Proposal("A compared with B", "comparison", "A"),
             Proposal("C risks, failures and criticism", "risks", "C"),
             Proposal("D key figures and statistics", "quantitative", "D")]
    kept, removed = repair_children(props, ["root"])
    assert [p.query for p in kept] == ["A compared with B", "C risks, failures and criticism",
                                       "D key figures and statistics"] and removed == 1
    # Three children without a quantitative facet cannot be repaired: the node becomes a leaf.
    no_quant = [props[0], props[2], Proposal("E history and timeline", "timeline", "E")]
    assert repair_children(no_quant, ["root"]) == ([], 3)


# -- offline proposer and extractor ------------------------------------------------------------------------------------


def _haymo_node() -> tuple[Node, tuple[Passage, ...]]:
    passages = (Passage("aaaaaaaa-0", "Haymo of Faversham", HAYMO), Passage("aaaaaaaa-1", "Alexander of Hales", HALES),
                Passage("aaaaaaaa-2", "Oxford", "Oxford is a city in England."))
    node = Node("n0", "Haymo of Faversham", 0, None, "overview", "Haymo of Faversham", passages=passages,
                statements=(Statement(sentences(HAYMO)[1], "aaaaaaaa-0", "Haymo of Faversham"),))
    return node, passages


def test_offline_sub_queries_come_from_entities_the_evidence_mentions() -> None:
    node, passages = _haymo_node()
    # Oxford was retrieved but the evidence never mentions it; the focus itself is taken.
    assert candidate_entities(node, passages, ["haymo of faversham"]) == ["Alexander of Hales", "University of Paris"]
    props = propose_children(node, ["Alexander of Hales", "University of Paris", "Roger Bacon", "Elias of Cortona"], 6)
    assert props[0] == Proposal("Alexander of Hales compared with Haymo of Faversham", "comparison",
                                "Alexander of Hales", "Haymo of Faversham")
    assert [(p.query, p.facet) for p in props[1:3]] == [("University of Paris risks, failures and criticism", "risks"),
                                                       ("Roger Bacon key figures and statistics", "quantitative")]
    assert len(props) == 4 and check_children([p.query for p in props], ["Haymo of Faversham"]) == []
    got = asyncio.run(OfflineProposer().propose(node, [], 6, frozenset({"haymo of faversham"})))
    assert [p.focus for p in got] == ["Alexander of Hales", "University of Paris"]


def test_offline_statements_are_about_the_node_and_ranked_by_facet() -> None:
    _, passages = _haymo_node()
    node = Node("n1", "Alexander of Hales key figures and statistics", 1, "n0", "quantitative", "Alexander of Hales")
    got = offline_statements(node, passages)
    assert got == [Statement(HALES, "aaaaaaaa-1", "Alexander of Hales"),
                   Statement(sentences(HAYMO)[1], "aaaaaaaa-0", "Haymo of Faversham")]
    assert asyncio.run(OfflineExtractor().extract(node, passages)) == got
    clipped = (Passage("bbbbbbbb-0", "Alexander of Hales", HALES + " He taught Bonaventure and Alexander of Hal",
                       clipped=True),)
    assert [s.text for s in offline_statements(node, clipped)] == [HALES]  # the cut sentence is never used
    root = page_root("Haymo of Faversham (friar)", HAYMO)
    assert root.query == root.focus == "Haymo of Faversham" and root.summary == sentences(HAYMO)[0]
    assert len(root.info_points) == 4


# -- tree growing (a hand-made retriever) ------------------------------------------------------------------------------


class TableRetriever:
    """Passages by query; unknown queries retrieve nothing."""

    def __init__(self, table: dict[str, Sequence[tuple[str, str]]]) -> None:
        self.table = table
        self.calls = 0

    async def __call__(self, query: str) -> list[Passage]:
        self.calls += 1
        return [Passage(f"{self.calls:08x}-{i}", t, x) for i, (t, x) in enumerate(self.table.get(query, ()))]


def test_tree_empty_retrieval_is_a_leaf_and_duplicates_are_counted() -> None:
    table = {
        "Haymo of Faversham": [("Haymo of Faversham", HAYMO), ("Alexander of Hales", HALES)],
        "Alexander of Hales compared with Haymo of Faversham": [("Alexander of Hales", HALES),
                                                                ("Haymo of Faversham", HAYMO)],
        "University of Paris key figures and statistics": [("Haymo of Faversham", HAYMO)],
    }
    retriever = TableRetriever(table)
    tree = asyncio.run(build_tree("k", page_root("Haymo of Faversham", HAYMO), retriever,
                                  OfflineProposer(), OfflineExtractor(), AlwaysExpand(), TreeConfig()))
    assert [(n.query, n.stop) for n in tree.nodes] == [
        ("Haymo of Faversham", None),
        ("Alexander of Hales compared with Haymo of Faversham", "no_children"),  # Paris is taken already
        ("English Franciscan risks, failures and criticism", "empty_retrieval"),
        ("University of Paris key figures and statistics", "gate"),  # only the root's sentence again
        ("St Bonaventure rules, policy and regulation", "empty_retrieval"),
    ]
    root, hales, _, paris, _ = tree.nodes
    assert root.children == ("n1", "n2", "n3", "n4") and len(root.statements) == 4
    assert [s.text for s in hales.statements] == [HALES] and paris.statements == ()
    assert tree.counts.empty_retrievals == 2 and tree.counts.duplicate_statements == 2 and retriever.calls == 5
    assert [(leaf.id, leaf.path) for leaf in leaves(tree)][:1] == [("n1", ("Haymo of Faversham", hales.query))]
    assert [leaf.id for leaf in leaves(tree)] == ["n1", "n2", "n3", "n4"]
    assert tree_from_json(to_json(tree)) == tree
    small = asyncio.run(build_tree("k", page_root("Haymo of Faversham", HAYMO), TableRetriever(table),
                                   OfflineProposer(), OfflineExtractor(), AlwaysExpand(), TreeConfig(max_nodes=3)))
    assert len(small.nodes) == 3 and small.nodes[0].children == ("n1", "n2")  # the budget counts proposed nodes


# -- selection, synthesis, audit ---------------------------------------------------------------------------------------


def _leaf(i: int, facet: str, focus: str, text: str, title: str, branch: str, depth: int = 2) -> Leaf:
    return Leaf(f"n{i}", ("Root", f"q{i}"), facet, focus, "Root" if facet == "comparison" else "", depth, branch,
                (Statement(text, f"0000000{i}-0", title),) if text else ())


LEAVES = [
    _leaf(1, "comparison", "Alexander of Hales", HALES, "Alexander of Hales", "n1", 1),
    _leaf(2, "risks", "Elias of Cortona", "Elias of Cortona was deposed as minister general in 1239.",
          "Elias of Cortona", "n2"),
    _leaf(3, "risks", "Brother Elias", "Elias of Cortona was deposed as minister general in 1239.",
          "Elias of Cortona", "n2"),
    _leaf(4, "quantitative", "Franciscan Order", "The Franciscan Order had some 30,000 friars by 1300.",
          "Franciscans", "n3"),
    _leaf(5, "timeline", "University of Paris", "", "", "n3"),
]


def test_selection_prefers_new_facets_and_branches_and_skips_repeats() -> None:
    chosen, trace = select_leaves(LEAVES)
    assert [x.id for x in chosen] == ["n1", "n2", "n4"]
    assert [(s.leaf_id, s.chosen, s.reason) for s in trace] == [
        ("n5", False, "no statements"),
        ("n1", True, "facet comparison, branch n1"),
        ("n2", True, "facet risks, branch n2"),
        ("n3", False, "repeats chosen evidence (1.00)"),
        ("n4", True, "facet quantitative, branch n3"),
    ]
    assert trace[1].score == 2.525  # 1 (new facet) + 0.5 (new branch) + 1 (no overlap) + 0.1 * 1/4


def _tree() -> Tree:
    return Tree("t-x", "s0-0", "offline", "Haymo of Faversham", "", (), ())


def test_merge_and_rubrics_are_templated_from_the_selected_leaves() -> None:
    chosen = [LEAVES[0], LEAVES[1], LEAVES[3]]
    question, steps = merge("Haymo of Faversham", chosen)
    assert question == ("In researching Haymo of Faversham: how does Alexander of Hales compare with Root; what "
                        "failures, risks or criticism are recorded for Elias of Cortona; and which figures and numbers "
                        "document Franciscan Order? Explain how these threads connect back to Haymo of Faversham, "
                        "citing a source for each point.")
    assert [(s.id, s.level, s.sources) for s in steps] == [("M1", 1, ("n1",)), ("M2", 1, ("n2",)), ("M3", 1, ("n4",)),
                                                           ("Q", 2, ("M1", "M2", "M3"))]
    rubrics = write_rubrics("Haymo of Faversham", chosen)
    assert [(r.id, r.type, r.weight, r.source_leaf_ids) for r in rubrics] == [
        ("R1", "factual", 0.8, ("n1",)), ("R2", "factual", 0.8, ("n2",)), ("R3", "factual", 0.8, ("n4",)),
        ("R4", "logical", 1.0, ("n1", "n2", "n4")), ("R5", "logical", 0.6, ("n1",)), ("R6", "logical", 0.5, ("n2",)),
        ("R7", "logical", 0.5, ("n4",)), ("R8", "logical", 0.6, ("n2",)),
    ]
    assert rubrics[0].description == "States that " + HALES and rubrics[0].evidence == (HALES,)
    pair = synthesise_offline(_tree(), LEAVES)
    assert pair.selected_leaf_ids == ("n1", "n2", "n4") and pair.question == question
    assert audit_pair(pair).decision == "KEEP" and validate_pair(pair) == []
    assert pair_from_json(to_json(pair)) == pair
    try:
        synthesise_offline(_tree(), LEAVES[:1])
    except Skip as skip:
        assert skip.reason == "too_few_leaves"
    else:
        raise AssertionError("one leaf cannot give a pair")


def test_audit_revises_repairable_rubrics_and_replaces_the_original() -> None:
    pair = synthesise_offline(_tree(), LEAVES)
    r = list(pair.rubrics)
    r[0] = replace(r[0], weight=-0.8)  # a negative weight on a needed fact
    r[1] = replace(r[1], evidence=("Elias was a saint.",))  # not a statement of its leaf
    r[2] = replace(r[2], source_leaf_ids=("n4", "n9"))  # n9 is not selected
    r[4] = replace(r[4], source_leaf_ids=("n7",))  # nothing of the selection left: removed
    bad = replace(pair, rubrics=tuple(r))
    codes = [(p.code, p.rubric_id) for p in find_problems(bad)]
    assert codes == [("suspect_negative", "R1"), ("evidence_not_grounded", "R2"), ("leaf_outside_selection", "R3"),
                     ("leaf_outside_selection", "R5")]
    verdict = audit_pair(bad)
    assert verdict.decision == "REVISE" and verdict.revised is not None
    fixed = verdict.revised
    assert [(x.id, x.weight, x.source_leaf_ids) for x in fixed.rubrics[:4]] == [
        ("R1", 0.8, ("n1",)), ("R2", 0.8, ("n2",)), ("R3", 0.8, ("n4",)), ("R4", 1.0, ("n1", "n2", "n4"))]
    assert fixed.rubrics[1].evidence == (LEAVES[1].statements[0].text,)
    assert len(fixed.rubrics) == 7 and validate_pair(fixed, 8) == [] and find_problems(fixed) == []


def test_audit_drops_what_cannot_be_repaired_and_never_passes_a_half_formed_pair() -> None:
    pair = synthesise_offline(_tree(), LEAVES)
    one_page = replace(pair, leaves=tuple(replace(x, statements=tuple(replace(s, title="Same") for s in x.statements))
                                          for x in pair.leaves))
    verdict = audit_pair(one_page)
    assert verdict.decision == "DROP" and verdict.reason == "single_source" and verdict.revised is None
    # Too few rubrics, and no unused statement to top them up with: repair fails, the pair is dropped.
    few = replace(pair, rubrics=pair.rubrics[:3])
    assert audit_pair(few).decision == "DROP" and audit_pair(few).reason == "unrepairable"
    assert validate_pair(few) == ["3 rubrics"]
    orphan = replace(pair, rubrics=(*pair.rubrics[:-1], Rubric("R8", "factual", "States a fact about nobody.", 0.5, (), ())))
    assert "R8: source_leaf_ids outside the selection" in validate_pair(orphan)


def test_stats_count_what_the_records_hold() -> None:
    node = {"statements": [{}], "stop": "max_depth"}
    trees = [{"mode": "offline", "tree": {"nodes": [node, node], "counts": {"duplicate_statements": 2}},
              "leaves": [{}]}, {"mode": "offline", "tree": {"nodes": [node], "counts": {}}, "leaves": [{}]}]
    audits = [{"decision": "KEEP"}, {"decision": "DROP", "reason": "single_source",
                                     "problems": [{"dimension": "deep_research"}]},
              {"decision": "SKIP", "reason": "too_few_leaves"}]
    pairs = [{"mode": "offline", "selected_leaf_ids": ["a", "b", "c"],
              "rubrics": [{"type": "factual"}] * 3 + [{"type": "logical"}] * 2}]
    s = compute_stats(trees, audits, pairs)
    assert (s["trees"], s["nodes_per_tree"], s["leaves_per_tree"], s["pairs_kept"]) == (2, 1.5, 1.0, 1)
    assert s["audit"] == {"KEEP": 1, "REVISE": 0, "DROP": 1} and s["dropped_by_reason"] == {"single_source": 1}
    assert s["trees_skipped_by_reason"] == {"too_few_leaves": 1} and s["factual_share"] == 0.6
    assert s["duplicate_statements_removed"] == 2 and s["stop_reasons"] == {"max_depth": 3}
