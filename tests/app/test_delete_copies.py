"""Deletion reaches the copies a retraining cycle makes (issue 34, finding 5), through `rubricem users delete-data` as
an admin runs it (in process through tests/cli.py, SQLite store in a temp data folder, real embedded Chroma): the run
folder of a finished cycle that held the person's data (questions.jsonl, the rollouts' log, its checkpoint copies),
the cycle's own `<bank>_run_<cycle>` collection and the judge's answer cache go; another cycle's folder and
collection, and the adapters folder, stay. A deletion while a cycle runs marks the version that cycle registers
afterwards, and the cycle's clean-up removes its folder when it ends. Run folders past the retention setting go after
each cycle."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import chromadb
import pytest

from app.settings import Settings
from learning.config import LearningConfig, RetrainConfig
from learning.judge.cache import CachedAnswer, JudgeCache
from store import PromptRecord, SessionLog, StoreConfig
from store.deletion import deletions, versions_trained_on_deleted_data
from store.records import BankItem
from store.registry import Registry
from store.rubric_bank import RubricBank
from tests.cli import CliResult, run_cli

PROMPT = PromptRecord(text="p", token_ids=(1,), prompt_sha="s")
SECRET = "ZEBU-ALICE-5521"  # appears only in alice's question
ALICE_Q = f"What did the {SECRET} ledger record in 1244?"
BOB_Q = "Who founded the Franciscan order?"


def rubricem(args: list[str], env: dict[str, str]) -> CliResult:
    """In process (tests/cli.py, issue 61): the console script's entry point without a Python start per call."""
    return run_cli(args, env)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("RUBRICEM_")}
    e.update({"RUBRICEM_STORE__DATA_DIR": str(tmp_path / "data"), "HF_HUB_OFFLINE": "1"})
    return e


def asked(log: SessionLog, owner: str, question: str) -> str:
    sid = log.create_session(question, PROMPT, {}, "base", owner=owner, source="chat")
    log.finish(sid, "completed", report=f"report on {question}")
    return sid


def run_folder(data: Path, cycle_id: str, questions: list[str]) -> Path:
    """What `RetrainApp.train` and `learning.grpo.train` leave: the questions, the rollouts' log and a checkpoint
    holding a copy of that log and of the run bank."""
    folder = data / "runs" / cycle_id
    (folder / "checkpoints" / "step-000000").mkdir(parents=True)
    (folder / "questions.jsonl").write_text("".join(json.dumps({"question": q}) + "\n" for q in questions))
    with SessionLog(folder / "rollouts.sqlite3") as rollouts:
        for q in questions:
            asked(rollouts, "local", q)
    copy = sqlite3.connect(str(folder / "checkpoints" / "step-000000" / "session_log.sqlite3"))
    source = sqlite3.connect(str(folder / "rollouts.sqlite3"))
    source.backup(copy)
    source.close()
    copy.close()
    (folder / "checkpoints" / "step-000000" / "bank.jsonl").write_text(
        "".join(json.dumps({"question": q}) + "\n" for q in questions))
    return folder


def run_bank(data: Path, cycle_id: str, question: str) -> None:
    """The cycle's own bank collection, as `app.training.build_trainer` names it."""
    cfg = StoreConfig(data_dir=data)
    bank = RubricBank(cfg.model_copy(update={"bank": cfg.bank.model_copy(update={
        "collection": f"{cfg.bank.collection}_run_{cycle_id}"})}))
    bank.put(BankItem.new(question=question, rubrics="r", takeaways="t", score=0.9, judge_model="j",
                          policy_version="base", session_id="rollout"))


def collections(data: Path) -> set[str]:
    return {c.name for c in chromadb.PersistentClient(path=str(data / "chroma")).list_collections()}


def finished_cycle(registry: Registry, log: SessionLog) -> str:
    cycle = registry.start_cycle("cli", log.now())
    registry.finish_cycle(cycle.cycle_id, "rejected")
    return cycle.cycle_id


def test_delete_data_removes_the_run_folder_run_collection_and_judge_cache_of_cycles_that_held_it(
        env: dict[str, str], tmp_path: Path) -> None:
    data = tmp_path / "data"
    with SessionLog(data / "rubricem.sqlite3") as log:
        registry = Registry(log)
        asked(log, "alice", ALICE_Q)
        held = finished_cycle(registry, log)  # its window held alice's session
        asked(log, "bob", BOB_Q)
        other = finished_cycle(registry, log)  # bob's only
    held_dir = run_folder(data, held, [ALICE_Q, BOB_Q])
    other_dir = run_folder(data, other, [BOB_Q])
    (data / "runs" / "adapters" / held).mkdir(parents=True)
    (data / "runs" / "adapters" / held / "adapter_config.json").write_text("{}")
    run_bank(data, held, ALICE_Q)
    run_bank(data, other, BOB_Q)
    cache = JudgeCache(data / "judge-cache")
    cache.put("ab" + "0" * 62, CachedAnswer(model="m", name="score", content=f"the answer quotes {SECRET}"))
    (data / "judge-cache" / "README").write_text("not an entry: left alone")

    done = rubricem(["users", "delete-data", "alice", "--yes"], env)

    assert done.returncode == 0, done.stderr
    assert not held_dir.exists()  # questions.jsonl, rollouts.sqlite3 and the checkpoint copies, whole
    assert other_dir.is_dir() and (other_dir / "rollouts.sqlite3").is_file()
    assert (data / "runs" / "adapters" / held / "adapter_config.json").is_file()  # the adapter is marked, not removed
    names = collections(data)
    assert f"rubric_bank_run_{held}" not in names and f"rubric_bank_run_{other}" in names
    assert cache.get("ab" + "0" * 62) is None and (data / "judge-cache" / "README").is_file()
    leftover = [p for p in (data / "runs").rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert leftover == []
    with SessionLog(data / "rubricem.sqlite3") as log:
        assert deletions(log)[0].counts["sessions"] == 1


def test_a_deletion_during_a_cycle_marks_the_version_it_registers_and_its_folder_goes_when_it_ends(
        env: dict[str, str], tmp_path: Path) -> None:
    data = tmp_path / "data"
    with SessionLog(data / "rubricem.sqlite3") as log:
        registry = Registry(log)
        asked(log, "alice", ALICE_Q)
        cycle = registry.start_cycle("scheduler", log.now())  # training on her question when the deletion comes
    folder = run_folder(data, cycle.cycle_id, [ALICE_Q])
    run_bank(data, cycle.cycle_id, ALICE_Q)

    done = rubricem(["users", "delete-data", "alice", "--yes"], env)

    assert done.returncode == 0, done.stderr
    assert f"a retraining cycle is running ({cycle.cycle_id})" in done.stdout
    assert folder.is_dir()  # the running cycle's own files are not pulled from under it
    adapter = data / "runs" / "adapters" / cycle.cycle_id
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text("{}")
    with SessionLog(data / "rubricem.sqlite3") as log:  # the cycle goes on: it registers what it trained
        registry = Registry(log)
        version = registry.register(adapter, parent="base", training_run=cycle.cycle_id,
                                    data_window={"start": cycle.window_start, "end": cycle.window_end, "sessions": 1})
        registry.finish_cycle(cycle.cycle_id, "rejected")
        assert versions_trained_on_deleted_data(log) == {version.name: 1}
        assert deletions(log)[0].versions == (version.name,)
        # Its clean-up, run by the cycle under the cycle lock (RetrainApp.aclose), removes its folder and collection.
        from app.retrain import purge_runs

        purged = purge_runs(Settings(store=StoreConfig(data_dir=data)), log)
    assert purged.run_folders == 1 and purged.run_collections == 1 and purged.done
    assert not folder.exists() and f"rubric_bank_run_{cycle.cycle_id}" not in collections(data)
    assert adapter.is_dir()
    assert f"{version.name}" in rubricem(["versions"], env).stdout.split("trained on data deleted later")[0]


def test_a_version_trained_from_a_marked_one_later_is_marked_too(tmp_path: Path, env: dict[str, str]) -> None:
    data = tmp_path / "data"
    adapters = []
    for name in ("v1", "v2"):
        adapters.append(tmp_path / name)
        adapters[-1].mkdir()
        (adapters[-1] / "adapter_config.json").write_text("{}")
    with SessionLog(data / "rubricem.sqlite3") as log:
        asked(log, "alice", ALICE_Q)
        first = Registry(log).register(adapters[0], parent="base", data_window={"start": None, "end": log.now()})
    assert rubricem(["users", "delete-data", "alice", "--yes"], env).returncode == 0
    with SessionLog(data / "rubricem.sqlite3") as log:
        child = Registry(log).register(adapters[1], parent=first.name, data_window={"start": log.now(),
                                                                                   "end": log.now()})
        assert versions_trained_on_deleted_data(log) == {first.name: 1, child.name: 1}


def test_run_folders_past_the_retention_setting_go_after_a_cycle(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with SessionLog(data / "rubricem.sqlite3") as log:
        registry = Registry(log)
        cycles = [finished_cycle(registry, log) for _ in range(3)]
        running = registry.start_cycle("cli", log.now())
        for cycle_id in [*cycles, running.cycle_id]:
            run_folder(data, cycle_id, [BOB_Q])
            run_bank(data, cycle_id, BOB_Q)
        settings = Settings(store=StoreConfig(data_dir=data),
                            learning=LearningConfig(retrain=RetrainConfig(keep_run_folders=1)))
        from app.retrain import purge_runs

        purge_runs(settings, log)
    kept = sorted(p.name for p in (data / "runs").iterdir())
    newest = Registry(SessionLog(data / "rubricem.sqlite3")).cycles(limit=10)
    finished = [c.cycle_id for c in newest if c.status != "running"]
    assert kept == sorted([finished[0], running.cycle_id])  # the newest finished one, and the one still running
    names = collections(data)
    assert {f"rubric_bank_run_{c}" for c in finished[1:]} & names == set()
    assert f"rubric_bank_run_{finished[0]}" in names and f"rubric_bank_run_{running.cycle_id}" in names
