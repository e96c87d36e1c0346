"""DeepRubric offline over the bundled demo corpus in a real index (Chroma + MiniLM + BM25): 20 trees, pairs that
the SFT loader reads, grounded evidence, statistics that match the files, resuming; and the CLI's bad input."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.ingest import ensure_demo_corpus, load_demo_corpus
from agent.tools.local_search import LocalSearch
from app.cli import main
from learning.deeprubric.build import AUDIT, PAIRS, TREES, BuildSettings, build
from learning.deeprubric.corpus import LocalRetriever, draw_seeds, index_pages
from learning.deeprubric.text import collapse
from learning.sft.generate import read_lines
from learning.sft.questions import load_questions
from store.config import StoreConfig
from store.doc_index import DocIndex

SEEDS = 20


@pytest.fixture(scope="module")
def demo_search(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSearch]:
    """local_search over the whole bundled demo corpus (precomputed vectors), one torch thread for query embedding."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a short query embeds ~10x faster on one thread when the cores are busy
    index = DocIndex(StoreConfig(data_dir=tmp_path_factory.mktemp("deeprubric-index")))
    ensure_demo_corpus(index)
    yield LocalSearch(index, k=5, snippet_chars=5000)
    torch.set_num_threads(threads)


def _run(out: Path, search: LocalSearch, n: int = SEEDS) -> object:
    seeds = draw_seeds(index_pages(sorted(search.index.sources())), n, 0)
    return asyncio.run(build(out, seeds, lambda key: LocalRetriever(search, key), BuildSettings("offline", 0, None)))


@pytest.mark.slow
def test_offline_build_over_the_demo_corpus(tmp_path: Path, demo_search: LocalSearch) -> None:
    out = tmp_path / "build"
    result = _run(out, demo_search)
    trees, audits, pairs = read_lines(out / TREES), read_lines(out / AUDIT), read_lines(out / PAIRS)
    assert len(trees) == len(audits) == SEEDS and len({t["key"] for t in trees}) == SEEDS
    assert len(pairs) >= 10
    assert all(t["mode"] == "offline" for t in trees) and all(p["mode"] == "offline" for p in pairs)

    # Every factual rubric's evidence is a statement found verbatim in a passage of the local index.
    corpus: dict[str, list[str]] = {}
    for doc in load_demo_corpus():
        corpus.setdefault(doc.title, []).append(collapse(doc.text))
    for p in pairs:
        selected = set(p["selected_leaf_ids"])
        assert [x["id"] for x in p["leaves"]] == p["selected_leaf_ids"] and 3 <= len(selected) <= 5
        statements = {s["text"]: s for x in p["leaves"] for s in x["statements"]}
        assert len(p["rubrics"]) >= 5 and p["format"] == "long_form" and p["answer"]
        for r in p["rubrics"]:
            assert r["source_leaf_ids"] and set(r["source_leaf_ids"]) <= selected  # never outside the selection
            assert -1 <= r["weight"] <= 1 and r["type"] in ("factual", "logical")
            if r["type"] == "factual":
                assert r["evidence"]
                for e in r["evidence"]:
                    assert e in statements and len(e) <= 240
                    assert any(e in text for text in corpus[statements[e]["title"]])
        for x in p["leaves"]:
            assert len(x["statements"]) <= 4 and x["path"][0] == p["root"]
        assert [m["id"] for m in p["merge_trace"]][-1] == "Q" and p["merge_trace"][-1]["query"] == p["question"]
        assert {s["leaf_id"] for s in p["selection_trace"] if s["chosen"]} == selected

    # The pairs file is a questions file for SFT generation.
    questions = load_questions(out / PAIRS)
    assert [q.id for q in questions] == [p["id"] for p in pairs]
    assert all(q.format == "long_form" and q.hops and q.answers for q in questions)

    # Statistics match the written files.
    stats = json.loads((out / "stats.json").read_text())
    assert stats == result.stats  # type: ignore[attr-defined]
    assert stats["trees"] == SEEDS and stats["pairs_kept"] == len(pairs)
    decisions = [a["decision"] for a in audits]
    assert stats["audit"] == {d: decisions.count(d) for d in ("KEEP", "REVISE", "DROP")}
    assert stats["audit"]["KEEP"] + stats["audit"]["REVISE"] == len(pairs)
    assert stats["nodes_per_tree"] == round(sum(len(t["tree"]["nodes"]) for t in trees) / SEEDS, 2)
    assert stats["rubrics"]["factual"] + stats["rubrics"]["logical"] == sum(len(p["rubrics"]) for p in pairs)
    assert max(len(t["tree"]["nodes"]) for t in trees) <= 50
    assert f"**{len(pairs)}**" in (out / "stats.md").read_text()

    # A rerun resumes: nothing is redone, nothing is duplicated.
    before = {name: (out / name).read_bytes() for name in (TREES, AUDIT, PAIRS)}
    again = _run(out, demo_search)
    assert (again.trees_built, again.trees_resumed, again.pairs_audited) == (0, SEEDS, 0)  # type: ignore[attr-defined]
    assert {name: (out / name).read_bytes() for name in before} == before

    # A crash: the last pair line cut in half, its audit line never written. The rerun redoes exactly that pair.
    last = pairs[-1]
    keep_audits = [a for a in audits if a["key"] != last["key"]]
    (out / AUDIT).write_text("".join(json.dumps(a) + "\n" for a in keep_audits))
    raw = before[PAIRS].decode()
    (out / PAIRS).write_text(raw[: len(raw) - len(json.dumps(last)) // 2 - 1])
    again = _run(out, demo_search)
    assert again.pairs_audited == 1  # type: ignore[attr-defined]
    assert [p["id"] for p in read_lines(out / PAIRS)] == [p["id"] for p in pairs]
    assert sorted(a["key"] for a in read_lines(out / AUDIT)) == sorted(a["key"] for a in audits)
    assert json.loads((out / "stats.json").read_text()) == stats


@pytest.mark.parametrize("argv", [["--seeds", "0"], ["--seeds", "-3"], ["--seeds", "2", "--max-nodes", "0"],
                                  ["--seeds", "2", "--topic", "  "]])
def test_cli_bad_input_exits_2_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  argv: list[str]) -> None:
    out = tmp_path / "build"
    assert main(["deeprubric", "build", *argv, "--out", str(out)]) == 2
    assert not out.exists()
    assert "error:" in capsys.readouterr().err


def test_cli_refuses_a_file_as_out_and_pairs_without_trees(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    assert main(["deeprubric", "build", "--seeds", "1", "--out", str(target)]) == 2
    assert main(["deeprubric", "pairs", "--out", str(tmp_path / "nothing")]) == 2
    assert not (tmp_path / "nothing").exists() and target.read_text() == "x"
