"""The policy registry on the real session log, both backends: versions, the live alias, rollback, cycles, opt-out."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from store.errors import InvalidInput
from store.records import PromptRecord
from store.registry import BASE, Registry, RegistryError
from tests.store.conftest import StoreTarget


def adapter(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": 4}))
    return path


@pytest.fixture
def registry(store_target: StoreTarget) -> Iterator[Registry]:
    with store_target.open() as log:
        yield Registry(log)


def test_base_is_live_then_promotion_and_rollback_move_the_alias_with_history(registry: Registry,
                                                                               tmp_path: Path) -> None:
    assert registry.live().name == BASE and registry.live().adapter_path is None
    v1 = registry.register(adapter(tmp_path / "a1"), parent=BASE, training_run="run-1", data_window={"sessions": 2})
    assert (v1.name, v1.status, v1.parent, v1.data_window) == ("policy@1", "candidate", BASE, {"sessions": 2})
    assert registry.live().name == BASE  # registering never changes what is live
    registry.promote(v1.name, "probe reward 0.52 >= 0.50")
    v2 = registry.register(adapter(tmp_path / "a2"), parent=v1.name)
    registry.promote(v2.name)
    assert registry.live().name == "policy@2" and registry.get("policy@1").status == "promoted"
    back = registry.rollback("bad answers reported")
    assert (back.version, back.previous, back.action) == ("policy@1", "policy@2", "rollback")
    assert registry.live().name == "policy@1"
    assert registry.rollback().version == BASE
    with pytest.raises(RegistryError, match="no earlier live version"):
        registry.rollback()
    assert [h.action for h in registry.history()] == ["rollback", "rollback", "promote", "promote", "init"]


def test_rejected_and_incomplete_versions_never_go_live(registry: Registry, tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="adapter_config.json"):
        registry.register(tmp_path / "missing", parent=BASE)
    with pytest.raises(InvalidInput, match="unknown parent"):
        registry.register(adapter(tmp_path / "a"), parent="policy@9")
    v = registry.register(tmp_path / "a", parent=BASE)
    registry.reject(v.name, "non-finite adapter weights", {"finite": False})
    with pytest.raises(RegistryError, match="rejected"):
        registry.promote(v.name)
    assert registry.get(v.name).eval_report == {"finite": False} and registry.live().name == BASE
    w = registry.register(adapter(tmp_path / "b"), parent=BASE)
    (tmp_path / "b" / "adapter_config.json").unlink()
    with pytest.raises(RegistryError, match="gone"):
        registry.promote(w.name)


def test_cycles_cover_new_sessions_once_and_respect_opt_out(registry: Registry) -> None:
    log = registry.log
    ids = []
    for q in ("a?", "b?", "c?"):
        sid = log.create_session(q, PromptRecord("p", (1,), "s"), {}, "base")
        log.finish(sid, "completed", report="r")
        ids.append(sid)
    registry.set_opt_out(ids[1])
    cycle = registry.start_cycle("cli", log.now())
    with pytest.raises(RegistryError, match="already running"):
        registry.start_cycle("cli", log.now())
    assert registry.running_cycle() == cycle
    assert registry.sessions_in_window(cycle.window_start, cycle.window_end) == [ids[0], ids[2]]
    registry.advance_cycle(cycle.cycle_id, "judged", numbers={"sessions": 2})
    done = registry.finish_cycle(cycle.cycle_id, "rejected", numbers={"reason": "worse"})
    assert done.numbers == {"sessions": 2, "reason": "worse"} and done.finished_at
    nxt = registry.start_cycle("scheduler", log.now())
    assert nxt.window_start == cycle.window_end
    assert registry.sessions_in_window(nxt.window_start, nxt.window_end) == []
    skipped = registry.record_skip("scheduler", "2 new sessions < 5", {"new_sessions": 2})
    assert skipped.status == "skipped" and registry.cycles()[0].cycle_id == skipped.cycle_id
