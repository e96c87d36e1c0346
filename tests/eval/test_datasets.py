"""Benchmark loaders on the real shared data files (skipped without them), and clear typed errors for bad folders and
files (on data each test writes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from learning.eval.datasets import (
    BENCHMARKS,
    DRB_DIMENSIONS,
    DatasetError,
    UnknownBenchmarkError,
    load_benchmark,
)

# (benchmark, folder under shared/data, expected item count in the shared split)
REAL = [
    ("hotpotqa", "wiki_multihop_corpus", 80),
    ("musique", "wiki_multihop_corpus", 80),
    ("hotpotqa", "hotpotqa", 400),
    ("musique", "musique", 400),
    ("2wikimultihopqa", "2wikimultihopqa", 400),
    ("bamboogle", "bamboogle", 100),
    ("simpleqa", "simpleqa", 3461),
    ("frames", "frames", 659),
    ("healthbench", "healthbench", 41 + 81),
    ("deep_research_bench", "deep_research_bench", 80),
    ("scholarqa_cs", "scholarqa_cs", 88),
]


@pytest.mark.parametrize(("bench", "folder", "count"), REAL)
def test_real_benchmarks_load(shared_data: Path, bench: str, folder: str, count: int) -> None:
    if not (shared_data / folder).is_dir():
        pytest.skip(f"{shared_data / folder} not present")
    items = load_benchmark(bench, shared_data / folder)
    assert len(items) == count
    assert len({i.id for i in items}) == count
    assert all(i.question for i in items)
    kind = BENCHMARKS[bench].kind
    if kind == "short_form":
        assert all(i.format == "exact_answer" and i.answers for i in items)
    elif kind == "scholarqa_cs":
        assert all(i.format == "long_form" and i.criteria for i in items)
    else:
        assert all(i.format == "short_form" and i.criteria for i in items)
    assert load_benchmark(bench, shared_data / folder, limit=3) == items[:3]


def test_corpus_paired_records_keep_aliases_and_supporting_titles(wiki_dir: Path) -> None:
    hotpot = load_benchmark("hotpotqa", wiki_dir, limit=1)[0]
    assert hotpot.id == "5a77ec115542992a6e59dff7" and hotpot.answers == ("a spirit",)
    assert hotpot.metadata["supporting_titles"] == ["Alû", "Lilu (mythology)"]
    musique = load_benchmark("musique", wiki_dir, limit=1)[0]
    assert musique.answers == ("G. Stanley Hall", "Stanley Hall")
    assert musique.metadata["supporting_titles"]


def test_healthbench_drb_and_scholarqa_structure(shared_data: Path) -> None:
    hb = load_benchmark("healthbench", shared_data / "healthbench")
    multi = next(i for i in hb if len(i.metadata["messages"]) > 1)
    assert multi.question.startswith("The following is a conversation") and "User:" in multi.question
    assert any(c.weight < 0 for i in hb for c in i.criteria)  # negative-point criteria are kept
    assert len({i.metadata["prompt_id"] for i in hb}) < len(hb)  # shared prompt_ids across files stay distinct

    drb = load_benchmark("deep_research_bench", shared_data / "deep_research_bench")[0]
    assert {c.group for c in drb.criteria} == set(DRB_DIMENSIONS)
    assert sum(drb.metadata["dimension_weight"].values()) == pytest.approx(1.0)
    for dim in DRB_DIMENSIONS:
        assert sum(c.weight for c in drb.criteria if c.group == dim) == pytest.approx(1.0, abs=1e-6)
    assert drb.reference and drb.metadata["reference_source"].startswith("baseline_claude")

    sqa = load_benchmark("scholarqa_cs", shared_data / "scholarqa_cs")[0]
    assert {c.group for c in sqa.criteria} == {"must_have", "nice_to_have"}
    assert all(c.evidence for c in sqa.criteria)


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
