"""Counts and shapes of the real benchmark files in ../shared/data, the workspace's data folder beside the clone.

The project never needs these files, and a clone on its own lacks them: tests/eval/conftest.py then does not collect
this module at all (a verbose run says so in its header) rather than skipping eleven tests.
test_datasets.py checks every loader's structure on synthetic and shipped files either way."""

from __future__ import annotations

from pathlib import Path

import pytest

from learning.eval.datasets import BENCHMARKS, load_benchmark
from tests.eval.support import HELDOUT

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
    assert (shared_data / folder).is_dir(), f"{shared_data / folder} is missing from the shared data folder"
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
    # What only the real files show (the synthetic tests below pin the exact shapes on a fresh clone):
    if folder == "wiki_multihop_corpus":  # the shipped held-out split copies these records as they are
        assert items[0] == load_benchmark(bench, HELDOUT, limit=1)[0]
    elif bench == "healthbench":
        assert any(len(i.metadata["messages"]) > 1 for i in items)
        assert any(c.weight < 0 for i in items for c in i.criteria)
        assert len({i.metadata["prompt_id"] for i in items}) < len(items)  # prompt_ids shared across files stay apart
    elif bench == "deep_research_bench":
        assert all(sum(i.metadata["dimension_weight"].values()) == pytest.approx(1.0) for i in items)
        assert items[0].reference and items[0].metadata["reference_source"].startswith("baseline_claude")
    elif bench == "scholarqa_cs":
        assert {c.group for c in items[0].criteria} == {"must_have", "nice_to_have"}
        assert all(c.evidence for c in items[0].criteria)
