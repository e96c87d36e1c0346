"""Benchmark loaders: exact structure checks on small synthetic files written here in each benchmark's own format and
on the shipped corpus-paired held-out questions (both always run, so a fresh clone without ../shared tests every
loader), and clear typed errors for bad folders and files. The counts on the real shared files are in
test_shared_benchmarks.py."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from learning.eval.datasets import (
    DRB_DIMENSIONS,
    Criterion,
    DatasetError,
    UnknownBenchmarkError,
    load_benchmark,
)
from tests.eval.support import HELDOUT

# ------------------------------------------------------------------------------ always run: shipped and synthetic files


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def _write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return path


def _write_csv(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as f:
        csv.writer(f).writerows([header, *rows])
    return path


def _hash_id(question: str) -> str:
    """The id the loaders give a record with no id column (learning.eval.datasets._question_id's documented rule)."""
    return "q" + hashlib.sha256(question.encode("utf-8")).hexdigest()[:12]


def test_corpus_paired_records_keep_aliases_and_supporting_titles() -> None:
    """The shipped held-out split holds the same first records as ../shared's wiki_multihop_corpus, so the real
    corpus-paired checks run on a fresh clone."""
    hotpot = load_benchmark("hotpotqa", HELDOUT, limit=1)[0]
    assert hotpot.id == "5a77ec115542992a6e59dff7" and hotpot.answers == ("a spirit",)
    assert hotpot.question == "If Gallu is a demon Lilu is what?" and hotpot.format == "exact_answer"
    assert hotpot.metadata == {"type": "bridge", "level": "easy", "supporting_titles": ["Alû", "Lilu (mythology)"]}
    musique = load_benchmark("musique", HELDOUT, limit=1)[0]
    assert musique.id == "2hop__150763_14904" and musique.answers == ("G. Stanley Hall", "Stanley Hall")
    assert musique.metadata == {"supporting_titles": ["Journal of Psychotherapy Integration", "Adolescence"]}
    assert [len(load_benchmark(b, HELDOUT)) for b in ("hotpotqa", "musique")] == [16, 16]


HOTPOT_TRAIN = [
    {"_id": "hp-1", "question": "Which river flows past the town where Ada Brook was born?", "answer": "the Wend",
     "type": "bridge", "level": "hard", "supporting_facts": [["Ada Brook", 0], ["Wendham", 1], ["Ada Brook", 2]],
     "context": [["Ada Brook", ["Ada Brook was born in Wendham."]], ["Wendham", ["Wendham lies on the Wend."]]]},
    {"_id": "hp-2", "question": "Are Ada Brook and Ben Carr both painters?", "answer": "yes", "type": "comparison",
     "level": "easy", "supporting_facts": [], "context": [["Ben Carr", ["Ben Carr is a painter."]]]},
]
MUSIQUE_TRAIN = [
    {"id": "2hop__11_12", "question": "Who founded the society that publishes the Journal of Lanterns?",
     "answer": "Mara Quill", "answer_aliases": ["M. Quill", "Mara Quill", "Quill"], "answerable": True,
     "question_decomposition": [{"id": 11, "question": "Journal of Lanterns >> publisher",
                                 "answer": "Lantern Society"}],
     "paragraphs": [
         {"idx": 0, "title": "Journal of Lanterns", "paragraph_text": "Published by the Lantern Society.",
          "is_supporting": True},
         {"idx": 1, "title": "Tide Almanac", "paragraph_text": "An almanac.", "is_supporting": False},
         {"idx": 2, "title": "Lantern Society", "paragraph_text": "Founded by Mara Quill.", "is_supporting": True},
         {"idx": 3, "title": "Lantern Society", "paragraph_text": "Its seat is Wendham.", "is_supporting": True}]},
    {"id": "2hop__13_14", "question": "When did the Tide Almanac stop printing?", "answer": "1901",
     "answer_aliases": [], "answerable": False, "paragraphs": []},
    {"id": "3hop1__15_16_17", "question": "In what year was the founder of Wendham's harbour born?", "answer": 1848,
     "answer_aliases": [], "answerable": True,
     "paragraphs": [{"idx": 0, "title": "Wendham", "paragraph_text": "A town.", "is_supporting": False}]},
]  # fmt: skip


def test_corpus_paired_json_files_keep_ids_aliases_and_supporting_titles(tmp_path: Path) -> None:
    """HotpotQA/MuSiQue *_train.json (HippoRAG's format): supporting titles once each in file order, aliases after the
    gold answer without repeats, unanswerable MuSiQue records left out, and the train file preferred over *_500."""
    _write_json(tmp_path / "hotpotqa_train.json", HOTPOT_TRAIN)
    _write_jsonl(tmp_path / "hotpotqa_500.jsonl", [{"idx": 9, "question": "Not read?", "answer": "no"}])
    _write_json(tmp_path / "musique_train.json", MUSIQUE_TRAIN)
    hp = load_benchmark("hotpotqa", tmp_path)
    assert [(i.id, i.question, i.answers, i.format) for i in hp] == [
        ("hp-1", HOTPOT_TRAIN[0]["question"], ("the Wend",), "exact_answer"),
        ("hp-2", HOTPOT_TRAIN[1]["question"], ("yes",), "exact_answer"),
    ]
    assert hp[0].metadata == {"type": "bridge", "level": "hard", "supporting_titles": ["Ada Brook", "Wendham"]}
    assert hp[1].metadata == {"type": "comparison", "level": "easy"}  # no supporting facts: no titles key
    mq = load_benchmark("musique", tmp_path)
    assert [i.id for i in mq] == ["2hop__11_12", "3hop1__15_16_17"]
    assert mq[0].answers == ("Mara Quill", "M. Quill", "Quill") and mq[1].answers == ("1848",)
    assert mq[0].metadata == {"supporting_titles": ["Journal of Lanterns", "Lantern Society"]}
    assert mq[1].metadata == {} and all(i.criteria == () and i.reference == "" for i in hp + mq)


@pytest.mark.parametrize(
    ("bench", "filename"),
    [("hotpotqa", "hotpotqa_500.jsonl"), ("musique", "musique_500.jsonl"), ("2wikimultihopqa", "2wiki_500.jsonl"),
     ("2wiki", "2wiki_500.jsonl"), ("bamboogle", "bamboogle.jsonl")],
)  # fmt: skip
def test_r1_searcher_jsonl_sets(tmp_path: Path, bench: str, filename: str) -> None:
    """The R1-Searcher samples (integer idx, answer, empty gen_text_store): the id is the idx as text, answers exact."""
    rows = [
        {"idx": 2, "question": "Which party campaigned for Wendham's home rule?", "answer": "The Harbour League",
         "gen_text_store": ""},
        {"idx": 7, "question": "When did Ada Brook's father die?", "answer": "3 November 1929", "gen_text_store": ""},
    ]  # fmt: skip
    _write_jsonl(tmp_path / filename, rows)
    items = load_benchmark(bench, tmp_path)
    assert [(i.id, i.question, i.answers, i.format, dict(i.metadata)) for i in items] == [
        ("2", rows[0]["question"], ("The Harbour League",), "exact_answer", {}),
        ("7", rows[1]["question"], ("3 November 1929",), "exact_answer", {}),
    ]


def test_simpleqa_and_frames_csv_sets(tmp_path: Path) -> None:
    """SimpleQA and FRAMES have no id column: the id is a hash of the question (a repeat gets -2); FRAMES keeps its
    reasoning types, SimpleQA's metadata column is not read."""
    q1, q2 = "In whose honour was the Wendham 1877 regatta held?", "Who painted the Tide Almanac's cover?"
    _write_csv(
        tmp_path / "sqa" / "simple_qa_test_set.csv", ["metadata", "question", "true_answer"],
        [["{'topic': 'Sports', 'answer_type': 'Person', 'urls': ['https://example.org/a']}", q1, "Ada Brook"],
         ["{'topic': 'Art', 'answer_type': 'Person', 'urls': []}", q2, "Ben Carr"],
         ["{'topic': 'Art', 'answer_type': 'Person', 'urls': []}", q2, "Ben Carr"]],
    )  # fmt: skip
    sqa = load_benchmark("simpleqa", tmp_path / "sqa")
    assert [(i.id, i.answers, dict(i.metadata)) for i in sqa] == [
        (_hash_id(q1), ("Ada Brook",), {}), (_hash_id(q2), ("Ben Carr",), {}), (_hash_id(q2) + "-2", ("Ben Carr",), {})
    ]
    assert sqa[0].id == "q" + hashlib.sha256(q1.encode()).hexdigest()[:12] and sqa[0].question == q1
    links = [f"wikipedia_link_{n}" for n in range(1, 11)]
    _write_csv(
        tmp_path / "frames" / "frames_test_set.csv",
        ["question", "true_answer", *links, "wikipedia_link_11+", "reasoning_types", "wiki_links"],
        [[q1, "Ada Brook", "https://example.org/a", *[""] * 10, "Multiple constraints | Temporal reasoning",
          "['https://example.org/a']"],
         [q2, "Ben Carr", *[""] * 11, "", "[]"]],
    )  # fmt: skip
    frames = load_benchmark("frames", tmp_path / "frames")
    assert [(i.id, i.answers, i.format, dict(i.metadata)) for i in frames] == [
        (_hash_id(q1), ("Ada Brook",), "exact_answer",
         {"reasoning_types": "Multiple constraints | Temporal reasoning"}),
        (_hash_id(q2), ("Ben Carr",), "exact_answer", {}),
    ]


HB_CONVERSATION = [
    {"role": "user", "content": "why did the dermatologist give me that cream? "},
    {"role": "assistant", "content": "Could you tell me what the cream is called?"},
    {"role": "user", "content": "hydrocortisone i think"},
]
HB_RUBRICS = [
    {"criterion": "Explains what hydrocortisone treats.", "points": 6, "tags": ["level:example", "axis:accuracy"]},
    {"criterion": "Tells the user to apply it ten times a day.", "points": -8, "tags": ["axis:accuracy"]},
]


def test_healthbench_structure(tmp_path: Path) -> None:
    """HealthBench: multi-turn prompts rendered as one question, negative points kept, a prompt_id shared by two files
    gives two items; the single-turn prompt is asked as is."""
    hb = tmp_path / "hb"
    _write_jsonl(hb / "b_hard.jsonl", [
        {"prompt_id": "p-1", "prompt": HB_CONVERSATION, "rubrics": HB_RUBRICS, "example_tags": ["theme:communication"],
         "ideal_completions_data": {"ideal_completion": "Hydrocortisone calms dry, itchy skin.",
                                    "ideal_completions_group": "Group 1", "ideal_completions_ref_completions": []},
         "canary": "healthbench:synthetic"},
    ])  # fmt: skip
    _write_jsonl(hb / "a_consensus.jsonl", [
        {"prompt_id": "p-1", "prompt": [{"role": "user", "content": "  my knee hurts after running  "}],
         "rubrics": [{"criterion": "Seeks the most informative context.", "points": 5, "tags": ["cluster:context"]}],
         "example_tags": [], "ideal_completions_data": None},
    ])  # fmt: skip
    single, multi = load_benchmark("healthbench", hb)  # files in name order
    assert (single.id, multi.id) == ("a_consensus:p-1", "b_hard:p-1")
    assert single.question == "my knee hurts after running" and single.reference == ""
    assert multi.question == (
        "The following is a conversation between a user and an AI assistant about a health question. "
        "Write the assistant's next reply to the user's last message.\n\n"
        "User: why did the dermatologist give me that cream?\n\n"
        "Assistant: Could you tell me what the cream is called?\n\n"
        "User: hydrocortisone i think"
    )
    assert multi.format == "short_form" and multi.reference == "Hydrocortisone calms dry, itchy skin."
    assert multi.criteria == (
        Criterion(text="Explains what hydrocortisone treats.", weight=6.0, tags=("level:example", "axis:accuracy")),
        Criterion(text="Tells the user to apply it ten times a day.", weight=-8.0, tags=("axis:accuracy",)),
    )
    assert dict(multi.metadata) == {"prompt_id": "p-1", "subset": "b_hard", "messages": HB_CONVERSATION,
                                    "example_tags": ["theme:communication"]}  # fmt: skip
    assert single.criteria == (
        Criterion(text="Seeks the most informative context.", weight=5.0, tags=("cluster:context",)),
    )


def _drb_criteria(tid: int) -> dict[str, Any]:
    """A criteria.jsonl record: dimension weights summing to 1 (in DRB's own key order) and criteria whose weights sum
    to 1 within each dimension."""
    crit = {
        "comprehensiveness": [{"criterion": "Covers income tiers", "explanation": "Breadth", "weight": 0.6},
                              {"criterion": "Covers debt", "explanation": "Scope", "weight": 0.4}],
        "insight": [{"criterion": "Explains causes", "explanation": "Depth", "weight": 1.0}],
        "instruction_following": [{"criterion": "Answers in the asked language", "explanation": "", "weight": 1.0}],
        "readability": [{"criterion": "Clear headings", "explanation": "Layout", "weight": 0.25},
                        {"criterion": "Plain wording", "explanation": "Style", "weight": 0.75}],
    }  # fmt: skip
    weights = {"readability": 0.14, "insight": 0.36, "comprehensiveness": 0.3, "instruction_following": 0.2}
    return {"id": tid, "prompt": f"Task {tid}", "dimension_weight": weights, "criterions": crit}


def test_deep_research_bench_structure(tmp_path: Path) -> None:
    """DRB joins query.jsonl, criteria.jsonl and the reference articles by task id: criteria grouped by dimension in
    DRB_DIMENSIONS order, dimension weights summing to 1, the stand-in articles used until reference.jsonl is there."""
    drb = tmp_path / "drb"
    _write_jsonl(drb / "query.jsonl", [
        {"id": 1, "topic": "Finance & Business", "language": "en", "prompt": "Survey household incomes in Wendham."},
        {"id": 2, "topic": "Science & Technology", "language": "zh", "prompt": "调研温德姆港的潮汐能。"},
    ])  # fmt: skip
    _write_jsonl(drb / "criteria.jsonl", [_drb_criteria(2), _drb_criteria(1)])
    articles = drb / "baseline_claude-3-7-sonnet-latest_cleaned_articles.jsonl"
    _write_jsonl(articles, [{"id": t, "prompt": f"Task {t}", "article": f"# Report {t}\n\nBody."} for t in (1, 2)])
    first, second = load_benchmark("deep_research_bench", drb)
    assert (first.id, second.id) == ("1", "2") and second.question == "调研温德姆港的潮汐能。"
    assert first.format == "short_form" and first.reference == "# Report 1\n\nBody."
    assert [(c.group, c.text, c.weight, c.explanation) for c in first.criteria] == [
        ("comprehensiveness", "Covers income tiers", 0.6, "Breadth"),
        ("comprehensiveness", "Covers debt", 0.4, "Scope"),
        ("insight", "Explains causes", 1.0, "Depth"),
        ("instruction_following", "Answers in the asked language", 1.0, ""),
        ("readability", "Clear headings", 0.25, "Layout"),
        ("readability", "Plain wording", 0.75, "Style"),
    ]
    weights = {"comprehensiveness": 0.3, "insight": 0.36, "instruction_following": 0.2, "readability": 0.14}
    assert dict(first.metadata) == {"language": "en", "topic": "Finance & Business", "dimension_weight": weights,
                                    "reference_source": articles.name}  # fmt: skip
    assert list(first.metadata["dimension_weight"]) == list(DRB_DIMENSIONS)
    assert sum(first.metadata["dimension_weight"].values()) == pytest.approx(1.0)
    for dim in DRB_DIMENSIONS:
        assert sum(c.weight for c in first.criteria if c.group == dim) == pytest.approx(1.0, abs=1e-6)

    _write_jsonl(drb / "reference.jsonl", [{"id": t, "prompt": "", "article": f"Official {t}"} for t in (1, 2)])
    official = load_benchmark("drb", drb)[1]
    assert official.reference == "Official 2" and official.metadata["reference_source"] == "reference.jsonl"
    _write_jsonl(drb / "criteria.jsonl", [_drb_criteria(1), {**_drb_criteria(2), "dimension_weight": {"insight": 1}}])
    with pytest.raises(DatasetError, match="task 2: expected dimension_weight and criterions"):
        load_benchmark("drb", drb)


def _sqa_case(case_id: str, annotator: str, nice_weight: float) -> dict[str, Any]:
    props = [
        {"name": "most_important_item_0", "criterion": "Defines type inference near the beginning.", "weight": 0.3,
         "evidence": ["Type inference deduces types.", "It helps editors."]},
        {"name": "most_important_item_1", "criterion": "Names at least two datasets.", "weight": 0.2, "evidence": []},
        {"name": "nice_to_have_item_0", "criterion": "Mentions dataset sizes.", "weight": nice_weight,
         "evidence": ["ManyTypes4Py holds 5,382 projects."]},
    ]  # fmt: skip
    question = "What datasets are used to evaluate type inference for Python?"
    config = {"question": question, "low_length": 300, "high_length": 600, "length_weight": 0.05,
              "expertise_weight": 0.05, "citations_weight": 0.2, "excerpts_weight": 0.1, "other_properties": props}
    return {"initial_prompt": question, "case_id": case_id, "annotator": annotator, "agreement": True,
            "metric_config": {"name": "rubric_corpusqa_generic", "config": config}}  # fmt: skip


def test_scholarqa_cs_structure(tmp_path: Path) -> None:
    """ScholarQA-CS: one item per annotator's case, most_important_* as must_have and the rest nice_to_have, evidence
    kept, the static weights in metadata, and the component weights checked to sum to 1."""
    _write_json(tmp_path / "test_configs_snippets.json",
                [_sqa_case("c-1", "Annotator 1 Assignments", 0.1), _sqa_case("c-2", "Annotator 2 Assignments", 0.1)])
    first, second = load_benchmark("sqa_cs", tmp_path)
    assert (first.id, second.id) == ("c-1", "c-2") and first.question == second.question
    assert first.format == "long_form" and first.answers == () and first.reference == ""
    assert first.criteria == (
        Criterion(text="Defines type inference near the beginning.", weight=0.3, group="must_have",
                  name="most_important_item_0", evidence=("Type inference deduces types.", "It helps editors.")),
        Criterion(text="Names at least two datasets.", weight=0.2, group="must_have", name="most_important_item_1"),
        Criterion(text="Mentions dataset sizes.", weight=0.1, group="nice_to_have", name="nice_to_have_item_0",
                  evidence=("ManyTypes4Py holds 5,382 projects.",)),
    )  # fmt: skip
    assert dict(first.metadata) == {
        "low_length": 300, "high_length": 600, "length_weight": 0.05, "expertise_weight": 0.05,
        "citations_weight": 0.2, "excerpts_weight": 0.1, "annotator": "Annotator 1 Assignments", "agreement": True,
    }  # fmt: skip
    assert second.metadata["annotator"] == "Annotator 2 Assignments"
    _write_json(tmp_path / "test_configs_snippets.json", [_sqa_case("c-3", "Annotator 1 Assignments", 0.0)])
    with pytest.raises(DatasetError, match="case 1: expected the component weights to sum to 1, got 0.9000"):
        load_benchmark("scholarqa_cs", tmp_path)


def test_missing_folder_and_file_are_typed_errors(tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as err:
        load_benchmark("hotpotqa", tmp_path / "nope")
    assert err.value.path == tmp_path / "nope" and "does not exist" in str(err.value)
    with pytest.raises(DatasetError, match="hotpotqa_train.json, hotpotqa_500.jsonl"):
        load_benchmark("hotpotqa", tmp_path)
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(DatasetError, match="expected a data folder"):
        load_benchmark("bamboogle", tmp_path / "f.txt")
    with pytest.raises(UnknownBenchmarkError, match="known: hotpotqa"):
        load_benchmark("nosuchbench", tmp_path)
    with pytest.raises(DatasetError, match="DRB needs query.jsonl"):
        load_benchmark("drb", tmp_path)


def test_invalid_records_name_the_line_and_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bamboogle.jsonl"
    bad.write_text('{"idx": 1, "question": "q?", "answer": "a"}\n{not json}\n')
    with pytest.raises(DatasetError, match="line 2: expected one JSON object per line") as err:
        load_benchmark("bamboogle", tmp_path)
    assert err.value.path == bad
    bad.write_text('{"idx": 1, "question": "q?"}\n')
    with pytest.raises(DatasetError, match="record 1: expected an answer field"):
        load_benchmark("bamboogle", tmp_path)
    bad.write_text('{"idx": 1, "question": "q?", "answer": "a"}\n{"idx": 1, "question": "r?", "answer": "b"}\n')
    with pytest.raises(DatasetError, match="unique item ids"):
        load_benchmark("bamboogle", tmp_path)


def test_generic_shortform_csv_and_healthbench_shape_checks(tmp_path: Path) -> None:
    (tmp_path / "qa.csv").write_text("problem,answer\nWho?,Ann\nWhen?,1990\n", encoding="utf-8")
    items = load_benchmark("shortform", tmp_path)
    assert [i.answers for i in items] == [("Ann",), ("1990",)]
    assert items[0].id.startswith("q") and items[0].id != items[1].id
    assert load_benchmark("shortform", tmp_path / "qa.csv") == items
    (tmp_path / "more.jsonl").write_text("{}\n")
    with pytest.raises(DatasetError, match="exactly one"):
        load_benchmark("shortform", tmp_path)

    hb = tmp_path / "hb"
    hb.mkdir()
    rec = {"prompt_id": "p1", "prompt": [{"role": "user", "content": "hi"}],
           "rubrics": [{"criterion": "bad", "points": -3, "tags": []}]}  # fmt: skip
    (hb / "x.jsonl").write_text(json.dumps(rec) + "\n")
    with pytest.raises(DatasetError, match="positive-point rubric"):
        load_benchmark("healthbench", hb)
    (hb / "x.jsonl").write_text(json.dumps({**rec, "prompt": "hi"}) + "\n")
    with pytest.raises(DatasetError, match="role, content"):
        load_benchmark("healthbench", hb)


def test_limit_must_be_positive(tmp_path: Path) -> None:
    rows = [{"id": f"h{i}", "question": f"Question {i}?", "answer": f"a{i}"} for i in range(3)]
    (tmp_path / "hotpotqa_500.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    for bad in (0, -1):
        with pytest.raises(ValueError, match=f"limit must be at least 1, got {bad}"):
            load_benchmark("hotpotqa", tmp_path, limit=bad)
    assert [i.id for i in load_benchmark("hotpotqa", tmp_path, limit=2)] == ["h0", "h1"]  # the same file loads
