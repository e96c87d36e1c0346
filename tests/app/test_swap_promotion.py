"""Every swap is verified on the promotion path (issue 63, item 2), embedded: `rubricem promote` and a retraining
cycle load the version into a real in-process llama.cpp engine (the product's default) and run the swap probe against
the trainer before `live` moves (learning/swap_verify.py; the probe on the engines alone is
tests/policy/test_swap_probe_engines.py, on real vLLM tests/app/test_vllm_loop.py and test_replica_promotion.py).

A swap whose served weights did not change (the engine's cache hands out the old adapter's conversion for the new
adapter: the load reports success and the old weights serve) is not promoted: `live` stays, the error names the
engine, the replica and both distances, and a cycle records them and fails before its gate, so no probe session is
ever recorded under the version. A good swap is promoted.

Each test has a deployment of its own: the converted SmolLM2 (linked, not copied) in a folder whose engine cache is
the test's, so a stale file never reaches the shared cache."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from agent.config import SHIPPED_SFT_ADAPTER
from app.cli import main
from app.settings import Settings
from store.registry import Registry
from store.session_log import SessionLog
from tests.adapters import scaled_adapter
from tests.indexes import seed_passages

import llama_cpp  # noqa: F401  (a broken install fails collection, as in tests/policy/test_llamacpp_engine.py)

from learning.engines.cpu_backend import RECORD_FILENAME  # noqa: E402
from learning.engines.gguf_lora import DIGEST_SUFFIX, adapter_digest, cached_lora  # noqa: E402


def _deployment(tmp_path: Path, smollm2_dir: Path, smollm2_gguf: Path) -> Path:
    """A model folder linking the converted SmolLM2's files, beside the shared machine records (the CPU variant) and
    an engine cache seeded with the SFT adapter's conversion (converting costs minutes on a busy machine)."""
    models = tmp_path / "models"
    model = models / smollm2_dir.name
    model.mkdir(parents=True)
    for f in smollm2_dir.iterdir():
        (model / f.name).symlink_to(f)
    shared = smollm2_dir.parent
    if (shared / RECORD_FILENAME).is_file():
        shutil.copy(shared / RECORD_FILENAME, models / RECORD_FILENAME)
    cache = models / "gguf-lora"
    cache.mkdir(mode=0o700)
    name = f"lora-{adapter_digest(SHIPPED_SFT_ADAPTER, smollm2_gguf)}.gguf"
    for f in (name, name + DIGEST_SUFFIX):
        if (shared / "gguf-lora" / f).is_file():
            shutil.copy(shared / "gguf-lora" / f, cache / f)
    return model


def _stale(adapter: Path, smollm2_gguf: Path, model: Path) -> None:
    """Put the SFT adapter's conversion (`base`'s weights here) in `model`'s engine cache under `adapter`'s key,
    recorded as valid."""
    cache = model.parent / "gguf-lora"
    old = cached_lora(SHIPPED_SFT_ADAPTER, smollm2_gguf, cache)
    stale = cache / f"lora-{adapter_digest(adapter, smollm2_gguf)}.gguf"
    shutil.copy(old, stale)
    shutil.copy(old.with_name(old.name + DIGEST_SUFFIX), stale.with_name(stale.name + DIGEST_SUFFIX))
    assert cached_lora(adapter, smollm2_gguf, cache) == stale


def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, model: Path) -> Settings:
    for name in [n for n in os.environ if n.startswith("RUBRICEM_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    for key, value in {"STORE__DATA_DIR": str(tmp_path / "data"), "AGENT__EMBEDDED_MODEL_PATH": str(model),
                       # `base` serves the SFT adapter, as the bundled model's default deployment does
                       "AGENT__EMBEDDED_ADAPTER_PATH": str(SHIPPED_SFT_ADAPTER),
                       "AGENT__EMBEDDED_THREADS": "1"}.items():
        monkeypatch.setenv(f"RUBRICEM_{key}", value)
    return Settings()


def test_promote_refuses_a_swap_the_engine_served_stale_and_live_stays(
        smollm2_dir: Path, smollm2_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    model = _deployment(tmp_path, smollm2_dir, smollm2_gguf)
    settings = _env(monkeypatch, tmp_path, model)
    reg = Registry(SessionLog.from_config(settings.store))
    adapter = scaled_adapter(SHIPPED_SFT_ADAPTER, tmp_path / "adapters" / "two", 0.5)
    version = reg.register(adapter, parent="base")
    _stale(adapter, smollm2_gguf, model)

    assert main(["promote", version.name]) == 1
    err = capsys.readouterr().err
    assert f"SwapNotVerified: the swap to {version.name} is not verified on llama.cpp replica in-process" in err
    assert f"distance to the trainer's {version.name}:" in err and "distance to the previous version base:" in err
    assert "still serves the previous weights" in err and f"{version.name} is not promoted" in err
    assert reg.live().name == "base" and [h.version for h in reg.history(limit=10)] == ["base"]
    assert reg.get(version.name).status == "candidate"


def test_promote_moves_live_after_a_good_swap_passes_the_probe(
        smollm2_dir: Path, smollm2_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    model = _deployment(tmp_path, smollm2_dir, smollm2_gguf)
    settings = _env(monkeypatch, tmp_path, model)
    reg = Registry(SessionLog.from_config(settings.store))
    version = reg.register(scaled_adapter(SHIPPED_SFT_ADAPTER, tmp_path / "adapters" / "two", 0.5), parent="base")

    assert main(["promote", version.name]) == 0
    out, err = capsys.readouterr()
    assert f"live: base -> {version.name}" in out
    assert f"swap to {version.name} verified on llama.cpp in-process" in err
    assert reg.live().name == version.name


def test_a_cycle_whose_candidate_is_served_stale_fails_before_its_gate_with_the_probe_recorded(
        smollm2_dir: Path, smollm2_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole cycle with only training replaced by a finished adapter (as tests/app/test_retrain_loop.py does):
    the candidate's swap fails its probe before the gate asks it anything; the cycle fails with the probe's record,
    `live` stays, and the gate's probe log holds no session."""
    from app.retrain import RetrainApp, gate_scratch
    from learning.pipeline import retrain

    model = _deployment(tmp_path, smollm2_dir, smollm2_gguf)
    settings = _env(monkeypatch, tmp_path, model)
    seed_passages(settings)
    trained = scaled_adapter(SHIPPED_SFT_ADAPTER, tmp_path / "trained", 0.5)

    async def cycle() -> Any:
        app = RetrainApp(settings)
        parts = app.parts()
        parts.seed_questions = ["Who was Haymo of Faversham?", "What is the Franciscan order?"]

        async def train(*_a: object) -> Path:
            return trained

        parts.train = train  # type: ignore[assignment]
        try:
            return await retrain(parts, settings.learning.retrain, force=True)
        finally:
            await app.aclose()

    # The staged copy is the version's folder (same files, so the same key): its conversion is stale in the cache.
    _stale(trained, smollm2_gguf, model)
    from learning.swap_probe import SwapNotVerified

    with pytest.raises(SwapNotVerified):
        asyncio.run(cycle())
    reg = Registry(SessionLog.from_config(settings.store))
    failed = reg.cycles(limit=1)[0]
    assert failed.status == "failed" and failed.candidate == "policy@1"
    probe = failed.numbers["swap_probe"]
    assert probe["version"] == "policy@1" and probe["engine"] == "llama.cpp" and probe["replica"] == "in-process"
    assert probe["after_swap"] is True
    assert probe["to_previous"] == 0.0 and probe["diverged_at"] is None and probe["to_new"] is not None
    assert "SwapNotVerified" in (failed.error or "") and "still serves the previous weights" in (failed.error or "")
    assert reg.live().name == "base" and reg.get("policy@1").status == "candidate"
    probes = gate_scratch(settings)[0]
    assert not probes.exists() or SessionLog(probes).list_sessions(limit=10) == []
