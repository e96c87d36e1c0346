"""`rubricem train --questions pairs.jsonl`: one real training step on DeepRubric pairs with the SS-GRPO credit (the
pairs' rubrics as persistent Answer-stage rubrics) and one with the `deeprubric` reward (METHOD §11.6, plain GRPO).

Same tiny budgets as the loop test in test_grpo.py, on a randomly initialised 2-layer model with SmolLM2's tokenizer
(the plumbing, not the learning), with the offline judge."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import pytest

from app.cli import main

TINY = {"steps": 1, "batch_questions": 1, "rollouts": 2, "max_tool_calls": 1, "plan_tokens": 24,
        "research_tokens": 16, "review_tokens": 16, "answer_tokens": 24, "reflection": False, "n_questions": 4,
        "curriculum_window": 0, "lr": 1e-3, "lora_r": 4, "gradient_checkpointing": False, "temperature": 1.0,
        "judge": "offline"}

PAIRS = [
    {"id": "dr-nolan", "question": "Who is Christopher Nolan, and which films of his do the sources discuss?",
     "format": "long_form", "rubrics": [
         {"id": "R1", "type": "factual", "description": "States that Christopher Nolan is a film director.",
          "weight": 0.8, "source_leaf_ids": ["n1"], "evidence": ["Christopher Nolan is a film director."]},
         {"id": "R2", "type": "logical", "description": "Names at least one of his films.", "weight": 0.5,
          "source_leaf_ids": ["n1"]},
         {"id": "R3", "type": "logical", "description": "Confuses him with another person.", "weight": -0.4,
          "source_leaf_ids": ["n1"]}]},
    {"id": "dr-prestige", "question": "What is The Prestige (film) about, and who made it?", "format": "long_form",
     "rubrics": [
         {"id": "R1", "type": "logical", "description": "Says who directed The Prestige.", "weight": 1.0,
          "source_leaf_ids": ["n2"]},
         {"id": "R2", "type": "logical", "description": "Summarises the plot of The Prestige.", "weight": 0.6,
          "source_leaf_ids": ["n2"]}]},
]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data folder for both runs, so the bundled corpus is indexed once."""
    return tmp_path_factory.mktemp("dr-train-data")


@pytest.fixture
def train_env(monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path, data_dir: Path, tmp_path: Path) -> Path:
    monkeypatch.setenv("RUBRICEM_STORE__DATA_DIR", str(data_dir))
    monkeypatch.setenv("RUBRICEM_AGENT__EMBEDDED_MODEL_PATH", str(tiny_model_dir))
    monkeypatch.delenv("RUBRICEM_LEARNING__JUDGE__BASE_URL", raising=False)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("\n".join(json.dumps(p) for p in PAIRS) + "\n", encoding="utf-8")
    return pairs


def _config(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\n' + "\n".join(f"{k} = {json.dumps(v)}" for k, v in TINY.items()) + "\n",
                    encoding="utf-8")
    return path


def _rows(out: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _persistent_titles(out: Path) -> set[str]:
    with sqlite3.connect(out / "rollouts.sqlite3") as db:
        payloads = [json.loads(r[0]) for r in db.execute("SELECT payload_json FROM rubric_buffers")]
    return {r["title"] for p in payloads for r in p["persistent"]}


@pytest.mark.slow
def test_one_ss_grpo_step_on_pairs_scores_against_their_rubrics(train_env: Path, tmp_path: Path) -> None:
    out = tmp_path / "run-ss"
    rc = main(["train", "--config", str(_config(tmp_path, "pairs-ss")), "--questions", str(train_env),
               "--out", str(out)])
    assert rc == 0
    (row,) = _rows(out)
    assert row["groups"] == 1 and math.isfinite(float(row["task/loss"]))  # type: ignore[arg-type]
    assert not any(k.startswith("deeprubric/") for k in row)
    # the pair's rubrics became the question's persistent Answer-stage rubrics in the run's judge buffer
    titles = _persistent_titles(out)
    assert titles & {"States that Christopher Nolan is a film director.", "Says who directed The Prestige."}
    assert (out / "adapters" / "pairs-ss@1" / "adapter_config.json").is_file()


@pytest.mark.slow
def test_one_step_with_the_deeprubric_reward(train_env: Path, tmp_path: Path) -> None:
    out = tmp_path / "run-dr"
    rc = main(["train", "--config", str(_config(tmp_path, "pairs-dr")), "--questions", str(train_env),
               "--reward", "deeprubric", "--out", str(out)])
    assert rc == 0
    (row,) = _rows(out)
    assert row["groups"] == 1 and math.isfinite(float(row["task/loss"]))  # type: ignore[arg-type]
    reward = float(row["deeprubric/reward"])  # type: ignore[arg-type]
    # one scalar per rollout, in every stage column; it lies within the reward's range
    assert row["reward/plan"] == row["reward/answer"] == pytest.approx(reward, abs=1e-4)
    assert -0.5 <= reward <= 1.0 and 0.0 <= float(row["deeprubric/format"]) <= 1.0  # type: ignore[arg-type]
    with sqlite3.connect(out / "rollouts.sqlite3") as db:  # reflections off: the stagewise judge is never called
        assert db.execute("SELECT COUNT(*) FROM judgements").fetchone() == (0,)
    assert (out / "adapters" / "pairs-dr@1" / "adapter_config.json").is_file()


def test_a_malformed_pairs_file_stops_train_before_anything_loads(train_env: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(PAIRS[0]) + "\n" + json.dumps({**PAIRS[1], "rubrics": [{"type": "x"}]}) + "\n",
                   encoding="utf-8")
    out = tmp_path / "never"
    rc = main(["train", "--config", str(_config(tmp_path, "bad")), "--questions", str(bad), "--out", str(out)])
    assert rc == 2
    assert "bad.jsonl:2:" in capsys.readouterr().err
    assert not out.exists()
