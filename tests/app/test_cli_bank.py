"""`rubricem bank ...` as a user runs it (in process through tests/cli.py, embedded Chroma under a temporary data
folder)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from store.config import StoreConfig
from store.records import BankItem
from store.rubric_bank import RubricBank
from tests.cli import CliResult, run_cli


def rubricem(args: list[str], env: dict[str, str]) -> CliResult:
    """In process (tests/cli.py, issue 61): the console script's entry point without a Python start per call."""
    return run_cli(args, env)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("RUBRICEM_")}
    e.update({"RUBRICEM_STORE__DATA_DIR": str(tmp_path / "data"), "HF_HUB_OFFLINE": "1"})
    return e


def _item(question: str, days: int) -> BankItem:
    return BankItem.new(question=question, rubrics="Pitfalls: guessing dates", takeaways="1. Check the year twice.",
                        score=0.6, judge_model="judge", policy_version="policy@1", session_id="s",
                        created_at=f"2026-11-{days:02d}T10:00:00+00:00")


def test_bank_commands_list_search_show_export_import_delete(env: dict[str, str], tmp_path: Path) -> None:
    bank = RubricBank(StoreConfig(data_dir=tmp_path / "data"))
    a, b = _item("Who wrote the novel Dracula?", 3), _item("What is the capital city of France?", 4)
    bank.put(a)
    bank.put(b)
    del bank

    listed = rubricem(["bank", "list"], env)
    assert listed.returncode == 0, listed.stderr
    assert "2 item(s)" in listed.stdout and listed.stdout.index(b.id) < listed.stdout.index(a.id)  # newest first

    within = rubricem(["bank", "search", "who wrote the novel dracula?"], env)
    assert "mode: within" in within.stdout and a.id in within.stdout
    cross = rubricem(["bank", "search", "Who wrote Frankenstein?", "--min-similarity", "0.3"], env)
    assert "mode: cross" in cross.stdout and a.id in cross.stdout

    shown = rubricem(["bank", "show", a.id], env)
    assert "<reflection_takeaways>\n1. Check the year twice.\n</reflection_takeaways>" in shown.stdout

    out = tmp_path / "bank.jsonl"
    assert rubricem(["bank", "export", str(out)], env).returncode == 0
    assert {json.loads(line)["id"] for line in out.read_text().splitlines()} == {a.id, b.id}
    assert rubricem(["bank", "delete", a.id], env).returncode == 0
    missing = rubricem(["bank", "delete", a.id], env)
    assert missing.returncode == 2 and "no rubric-bank item" in missing.stderr
    imported = rubricem(["bank", "import", str(out)], env)
    assert imported.returncode == 0 and "stored 2" in imported.stdout
    assert "2 item(s)" in rubricem(["bank", "list"], env).stdout

    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    refused = rubricem(["bank", "import", str(bad)], env)
    assert refused.returncode == 2 and "bad.jsonl:1" in refused.stderr
