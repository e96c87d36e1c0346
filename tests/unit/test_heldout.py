"""The held-out evaluation set (issue 38): what it holds, that it never overlaps training, the guard that refuses it in
a training pool, and the per-session figures (gold recall, citation precision/recall, cover-EM)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.report import build_report
from learning.eval.datasets import bench_spec
from learning.eval.heldout import (
    HeldoutItem,
    HeldOutQuestionError,
    heldout_index,
    load_heldout,
    normalize_question,
    refuse_heldout,
    session_figures,
)
from learning.pipeline import training_questions
from store.records import PromptRecord, Snippet, ToolCallRecord, Trajectory, Turn
from store.session_log import SessionLog

ROOT = Path(__file__).resolve().parents[2]
TRAIN_SPLIT = ROOT / "learning" / "sft" / "data" / "train"


def test_the_heldout_set_has_40_questions_32_with_gold_passages_and_unique_ids() -> None:
    items = load_heldout()
    assert len(items) == 40 and sum(1 for i in items if i.gold_titles) == 32
    assert {i.source for i in items if not i.gold_titles} == {"2wikimultihopqa"}
    assert len({i.id for i in items}) == 40 and len(heldout_index(items)) == 40
    assert all(i.format == "exact_answer" and i.answers for i in items)


def test_no_heldout_question_is_in_the_training_split_the_sft_adapter_and_the_curve_train_on() -> None:
    index = heldout_index(load_heldout())
    train = [e.question for name in ("hotpotqa", "musique") for e in bench_spec(name).loader(TRAIN_SPLIT)]
    assert len(train) == 128
    refuse_heldout(train, index)  # raises on any overlap


def test_a_heldout_question_in_a_training_pool_is_refused_with_its_id_even_respaced_and_recased() -> None:
    items = load_heldout()
    index = heldout_index(items)
    q = items[3].question
    with pytest.raises(HeldOutQuestionError, match=items[3].id):
        refuse_heldout(["an ordinary question?", "  " + q.upper().replace(" ", "   ") + " "], index, "step 1")
    assert normalize_question(" A\u00a0b  C ") == "a b c"
    respelled = normalize_question("Who\u200b was O\u2019Brien?")
    assert respelled == normalize_question("who was o'brien") == "who was o'brien"


def test_build_trainer_refuses_a_pool_holding_a_heldout_question_before_loading_anything(tmp_path: Path) -> None:
    from app.settings import Settings
    from app.training import build_trainer
    from learning.train_config import load_config
    from store.config import StoreConfig

    held = load_heldout()[0]
    qfile = tmp_path / "q.jsonl"
    qfile.write_text("".join(json.dumps({"question": q}) + "\n" for q in ("first question?", held.question,
                                                                          "third question?")))
    cfg = load_config(None, None, name="leak", questions=qfile, steps=1, out_dir=tmp_path / "run")
    settings = Settings(store=StoreConfig(data_dir=tmp_path / "data", model_cache=tmp_path / "models"))
    with pytest.raises(HeldOutQuestionError, match=held.id):
        build_trainer(settings, cfg)
    assert not (tmp_path / "models").exists()  # refused before any model was converted or loaded


def test_the_online_loop_leaves_heldout_questions_out_and_says_which(tmp_path: Path) -> None:
    items = load_heldout()
    log = SessionLog(tmp_path / "s.sqlite3")
    prompt = PromptRecord("p", (1,), "h")
    ids = []
    for q in ("a user question?", items[0].question, "another user question?"):
        sid = log.create_session(q, prompt, {}, "base", source="chat")
        log.finish(sid, "completed", report="r")
        ids.append(sid)
    said: list[str] = []
    got = training_questions(log, ids, [items[1].question, "a seed question?"], heldout_index(items), said.append)
    assert got == ["a user question?", "another user question?", "a seed question?"]
    assert said and items[0].id in said[0] and items[1].id in said[0]


def _session(answer: str, titles: tuple[str, ...]) -> tuple[Trajectory, object]:
    snippets = tuple(Snippet(f"abcdef0{k}-0", "local_search", t, f"text {k}") for k, t in enumerate(titles))
    traj = Trajectory(session_id="s", question="q", prompt=PromptRecord("p", (1,), "h"),
                      turns=(Turn("answer", "sampled", answer, (1,)),),
                      tool_calls=(ToolCallRecord("local_search", "q", snippets=snippets),))
    return traj, build_report(traj)


ITEM = HeldoutItem("hotpotqa:x", "hotpotqa", "q?", ("a spirit",), ("Alû", "Lilu (mythology)"))


def test_figures_count_gold_searches_gold_citations_and_the_boxed_answer() -> None:
    traj, report = _session("<answer>Lilu is \\boxed{a spirit} <cite id=\"abcdef01-0\">x</cite> "
                            "<cite id=\"abcdef02-0\">y</cite></answer>", ("Alû", "Lilu (mythology)", "Demon Dice"))
    f = session_figures(ITEM, traj, report)
    assert f["gold_recall"] == 1.0  # both gold passages were among the searches' results
    assert f["citation_precision"] == 0.5 and f["citation_recall"] == 0.5  # cited Lilu (gold) and Demon Dice
    assert f["cover_em"] == 1.0 and f["boxed"] == 1.0 and f["cited"] == 1.0


def test_an_uncited_wrong_answer_scores_zero_precision_and_a_no_gold_item_has_no_passage_figures() -> None:
    traj, report = _session("<answer>It is a demon.</answer>", ("Alû",))
    f = session_figures(ITEM, traj, report)
    assert f["gold_recall"] == 0.5 and f["citation_precision"] == 0.0 and f["citation_recall"] == 0.0
    assert f["cover_em"] == 0.0 and f["boxed"] == 0.0 and f["cited"] == 0.0
    no_gold = HeldoutItem("2wikimultihopqa:3", "2wikimultihopqa", "q?", ("a demon",), ())
    g = session_figures(no_gold, traj, report)
    assert g["gold_recall"] is None and g["citation_precision"] is None and g["cover_em"] == 1.0


def test_every_heldout_and_training_split_file_ships_in_the_package() -> None:
    """`load_heldout` runs in every training and retrain cycle, so its files must be in an installed package (the
    Docker images `pip install .`), not only in a checkout."""
    import fnmatch
    import tomllib

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["learning"]
    data = ROOT / "learning" / "sft" / "data"
    files = [p.relative_to(ROOT / "learning").as_posix() for p in data.rglob("*") if p.is_file()]
    assert any(f.endswith(".jsonl") for f in files)
    missing = [f for f in files if not any(fnmatch.fnmatch(f, g) for g in globs)]
    assert not missing, f"not in [tool.setuptools.package-data] learning: {missing}"
