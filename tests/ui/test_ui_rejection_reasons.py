"""Issue 65, finding 13: a candidate rejected before the gate is stored with a reason that names server paths and
exception text. The Learning page, which every signed-in person may open, shows a person who is not an admin one fixed
sentence and an error reference (logged by the trainer with the whole reason); an admin sees the whole reason. The
gate's own sentences (numbers only) are shown to everyone as they were.

Real parts: the retraining pipeline (`learning.pipeline.retrain`) rejecting a broken adapter through the real
`adapter_problem`, a real SQLite store and registry, the page script through Streamlit's AppTest. The training step
is replaced by a function that returns the broken adapter folder (training itself is not under test).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app.container import Services
from app.settings import UIConfig
from app.ui.view import rejection_text
from learning.config import RetrainConfig
from learning.evaluate import VersionScore, decide, team_gate
from learning.judge.offline import OfflineJudge
from learning.pipeline import CycleResult, RetrainParts, retrain
from store.registry import Registry
from tests.ui.test_ui_apptest import TIMEOUT, _learning_script
from tests.ui.test_ui_login_security import light  # noqa: F401 - fixture

SECRET_DIR = "srv-rubricem-secret-runs-7q"  # a server folder a visitor must not learn


def _shown(at: AppTest) -> Iterator[str]:
    """Every text the page drew, tables included."""
    for kind in ("markdown", "caption", "info", "error", "warning", "success", "title", "subheader", "metric"):
        for element in getattr(at, kind):
            yield str(element.value)
    for table in at.dataframe:
        yield table.value.to_string()


def _broken_adapter(root: Path, kind: str) -> Path:
    """A trained-adapter folder the gate cannot serve: its weights missing, or not a safetensors file."""
    folder = root / "trained"
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 4}))
    if kind == "unreadable":
        (folder / "adapter_model.safetensors").write_bytes(b"\xff" * 64)
    return folder


def _reject(svc: Services, trained: Path) -> CycleResult:
    """One forced retraining cycle whose training step produced `trained`: the pipeline rejects it before the gate."""

    async def train(*_args: object) -> Path:
        return trained

    async def never(*_args: object) -> None:
        raise AssertionError("a rejected candidate is never probed or served")

    judge = OfflineJudge()
    parts = RetrainParts(log=svc.log, registry=Registry(svc.log), judge=judge, gate_judge=judge, train=train,
                         probe_for=never, activate=never,  # type: ignore[arg-type]
                         adapters_dir=svc.settings.store.data_dir / SECRET_DIR / "adapters", probe_questions=["q?"],
                         seed_questions=["Who was Haymo of Faversham?", "Where is Faversham?"])
    return asyncio.run(retrain(parts, RetrainConfig(), force=True))


def _reasons(at: AppTest) -> tuple[str, str]:
    """The rejected version's reason in the versions table, and the rejected cycle's in the cycles table."""
    versions = next(t.value for t in at.dataframe if "held-out score" in t.value.columns)
    cycles = next(t.value for t in at.dataframe if "trigger" in t.value.columns)
    version = versions[versions["status"] == "rejected"]["reason"].tolist()
    cycle = cycles[cycles["status"] == "rejected"]["reason"].tolist()
    assert len(version) == 1 and len(cycle) == 1
    return version[0], cycle[0]


@pytest.mark.parametrize("kind", ["missing", "unreadable"])
def test_a_rejected_candidate_shows_a_fixed_sentence_and_a_reference_to_non_admins(
        light: object, tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    svc: Services = light(UIConfig())  # type: ignore[operator]
    with caplog.at_level(logging.ERROR, logger="learning.evaluate"):
        result = _reject(svc, _broken_adapter(tmp_path, kind))
    assert result.cycle.status == "rejected"
    stored = result.cycle.numbers["reason"]
    assert SECRET_DIR in stored or "SafetensorError" in stored  # the operator's record keeps the detail

    page = AppTest.from_function(_learning_script, default_timeout=TIMEOUT)
    page.session_state["user_id"], page.session_state["role"] = "bob", "user"  # any signed-in person
    page.run()
    assert not page.exception, page.exception
    text = "\n".join(_shown(page))
    for secret in (SECRET_DIR, str(tmp_path), "SafetensorError", "lacks adapter_config", "deserializ"):
        assert secret not in text, secret
    version, cycle = _reasons(page)
    assert version == cycle
    found = re.fullmatch(r"The candidate was rejected \(error reference: ([0-9a-f]{8}); the "
                         r"details are in the retraining log\)\.", version)
    assert found, version
    # The reference leads the operator to the whole reason in the trainer's log.
    logged = [r.getMessage() for r in caplog.records if found.group(1) in r.getMessage()]
    assert len(logged) == 1 and (SECRET_DIR in logged[0] or "SafetensorError" in logged[0]), logged

    admin = AppTest.from_function(_learning_script, default_timeout=TIMEOUT)
    admin.session_state["user_id"], admin.session_state["role"] = "root", "admin"
    admin.run()
    assert not admin.exception, admin.exception
    assert _reasons(admin) == (stored, stored)  # an admin sees the detail


def test_the_gates_own_sentences_are_shown_to_everyone_and_nothing_else_passes_as_one() -> None:
    from learning.evaluate import is_gate_reason  # issue 65's; imported here so the test above runs without it

    def score(total: float, failed: int = 0) -> VersionScore:
        return VersionScore("v", {}, total, 4, failed)

    decisions = [decide(score(0.5), score(0.51), 0.02, "j"), decide(score(0.1), score(0.51), 0.02, "j"),
                 decide(score(0.9, failed=2), score(0.5), 1e-05, "j"),
                 decide(score(float("nan")), score(0.5), 0.0, "j"),
                 decide(score(0.5), score(float("nan")), 0.02, "j")]
    decisions.append(team_gate(decisions[0], decisions[1]))
    assert all(is_gate_reason(d.reason) for d in decisions), [d.reason for d in decisions]
    for other in ("/srv/x lacks adapter_config.json or adapter_model.safetensors",
                  "probe score 0.1 < live 0.2 - tolerance 0.02 at /srv/x", "non-finite adapter weights in 1 tensor(s)",
                  "team questions: /srv/x; general questions: probe score 1 < live 2 - tolerance 0"):
        assert not is_gate_reason(other), other


def test_a_team_gates_refusal_is_shown_to_the_teams_people_as_the_global_gates_sentences_are(
        light: object, tmp_path: Path) -> None:  # noqa: F811
    """A team candidate whose team has no question of its own left when it is gated (its sessions opted out while it
    trained) is rejected by the team gate with a sentence of fixed words and the team's name (issue 65, finding 4):
    no path, no exception text. Like the gate's numeric sentences (`team_gate`'s among them), the team's people see
    it as it is, not the fixed sentence and a reference meant for reasons that name server paths."""
    import shutil

    from agent.config import SHIPPED_SFT_ADAPTER
    from store import PromptRecord
    from store.teams import Teams
    from store.users import Users

    svc: Services = light(UIConfig())  # type: ignore[operator]
    log = svc.log
    Users(log).add("alice", password="alice's password", consent=True)
    Users(log).add("bob", password="bob's password", consent=True)
    Teams(log).add("law")
    Teams(log).assign("alice", "law")
    Teams(log).assign("bob", "law")
    sid = log.create_session("What is tort law?", PromptRecord("p", (1,), "s"), {}, "base", owner="alice")
    log.finish(sid, "completed", report="r")

    async def train(*_args: object) -> Path:
        Users(log).set_consent("alice", False)  # meanwhile, in the app: the team's one question leaves its window
        return Path(shutil.copytree(SHIPPED_SFT_ADAPTER, tmp_path / "trained"))  # a finished, sound adapter

    async def never(*_args: object) -> None:
        raise AssertionError("a candidate with no team question left is never probed or served")

    judge = OfflineJudge(log)
    parts = RetrainParts(log=log, registry=Registry(log), judge=judge, gate_judge=OfflineJudge(None), train=train,
                         probe_for=never, activate=never,  # type: ignore[arg-type]
                         adapters_dir=svc.settings.store.data_dir / "adapters", probe_questions=["q?"],
                         seed_questions=["Who was Haymo of Faversham?"])
    result = asyncio.run(retrain(parts, RetrainConfig(), team="law"))
    assert result.cycle.status == "rejected" and result.gate is None, result.message
    stored = result.cycle.numbers["reason"]
    assert stored.startswith("team law has no question of its own left in the cycle's window to gate on"), stored

    page = AppTest.from_function(_learning_script, default_timeout=TIMEOUT)
    page.session_state["user_id"], page.session_state["role"] = "bob", "user"  # one of the team's people
    page.run()
    assert not page.exception, page.exception
    assert _reasons(page) == (stored, stored)  # as it is, as a gate's sentence is
    for other in (f"{stored} ({SECRET_DIR})", stored.replace("team law", "team /srv/x")):  # nothing else passes as it
        assert rejection_text(other, "cycle c", admin=False).startswith("The candidate was rejected"), other
