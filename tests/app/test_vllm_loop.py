"""The online loop's edges on the real vLLM (CPU build, `make vllm`): a hot swap while requests run; a server
killed in the middle of a session; a stale adapter caught by the swap probe and not promoted, and a team's adapter
loaded again after the server restarts (issue 63). A whole cycle on vLLM (sessions served and judged, an SS-GRPO
update on vLLM's rollouts, the gate, promotion, rollback) is `tests/app/test_vllm_teams.py`'s and
`tests/app/test_replica_promotion.py`'s."""

from __future__ import annotations

import asyncio
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.config import SHIPPED_SFT_ADAPTER, AgentConfig, RunOptions, StageTokenCaps
from agent.errors import PolicyRequestError
from agent.policy import VLLMPolicyClient
from agent.protocols import ChatMessage
from app.settings import Settings
from learning.config import LearningConfig, RetrainConfig
from store.config import StoreConfig
from store.registry import Registry
from store.session_log import SessionLog
from tests.adapters import unload_adapters
from tests.indexes import seed_passages

pytestmark = pytest.mark.slow

SMALL = RunOptions(format="short_form", max_tool_calls=1, temperature=0.7, seed=1, wall_clock_s=600,
                   token_caps=StageTokenCaps(plan=24, research=16, review=16, answer=24), context_tokens=4096)


def running(server: Any) -> int:
    """Requests the engine is running now, from vLLM's Prometheus metrics."""
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    return int(sum(float(m) for m in re.findall(r"^vllm:num_requests_running\{[^}]*\} ([0-9.e+]+)$", text, re.M)))


def finished(server: Any) -> dict[str, int]:
    """Requests the engine has finished so far, by finish reason (stop, length, abort, error, ...), from its
    `vllm:request_success_total` counters: the server's own count, not what the client collected."""
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    out: dict[str, int] = {}
    for labels, value in re.findall(r"^vllm:request_success_total\{([^}]*)\} ([0-9.e+]+)$", text, re.M):
        reason = re.search(r'finished_reason="([^"]*)"', labels)
        key = reason.group(1) if reason else "?"
        out[key] = out.get(key, 0) + int(float(value))
    return out


def _wait_running(server: Any, n: int, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while running(server) < n:
        assert time.monotonic() < deadline, f"fewer than {n} requests ever ran at once"
        time.sleep(0.05)


def test_an_adapter_loaded_while_requests_run_loses_none_and_each_records_its_version(real_vllm: Any) -> None:
    """Eight long requests run on the base model; the SFT adapter is loaded and published while they run (checked on
    the server's metrics before and after the load); four more go to the new version, and the adapter is unloaded
    while they run too. All twelve complete, each with the version it was sent with; a request sent after the
    unload is refused."""
    async def go() -> tuple[list[Any], int, int, int]:
        client = VLLMPolicyClient(real_vllm.url, "policy", timeout_s=600, max_retries=0)
        try:
            ctx = await client.render_prompt([ChatMessage("user", "Write a long story about a lighthouse.")])

            def ask(seed: int) -> Any:
                return asyncio.create_task(client.generate(ctx, stop=[], max_tokens=96, temperature=0.7, seed=seed))

            done_before = await asyncio.to_thread(finished, real_vllm)
            first = [ask(i) for i in range(8)]
            await asyncio.to_thread(_wait_running, real_vllm, 1)
            before = await asyncio.to_thread(running, real_vllm)
            await client.aload_adapter(SHIPPED_SFT_ADAPTER, "policy@hot")
            during = await asyncio.to_thread(running, real_vllm)  # still running after the load returned
            later = [ask(100 + i) for i in range(4)]
            await asyncio.to_thread(_wait_running, real_vllm, 9)  # at least one request on the new version runs
            await client.unload_lora_adapter("policy@hot")
            at_unload = await asyncio.to_thread(running, real_vllm)
            gens = await asyncio.gather(*first, *later)
            done_after = await asyncio.to_thread(finished, real_vllm)
            # The engine itself finished exactly these twelve, none aborted or failed: nothing lost server-side.
            delta = {k: done_after.get(k, 0) - done_before.get(k, 0) for k in done_after}
            assert sum(delta.values()) == 12 and delta.get("stop", 0) + delta.get("length", 0) == 12, delta
            with pytest.raises(PolicyRequestError) as gone:
                await client.generate(ctx, stop=[], max_tokens=4, temperature=0.0)
            assert gone.value.status_code == 404 and client.model == "policy@hot"
            return list(gens), before, during, at_unload
        finally:
            await client.aclose()

    gens, before, during, at_unload = asyncio.run(go())
    assert before >= 1 and during >= 1 and at_unload >= 9, (before, during, at_unload)
    assert [g.policy_version for g in gens] == ["policy"] * 8 + ["policy@hot"] * 4
    assert all(g.finish_reason in ("length", "stop") and len(g.token_ids) == len(g.logprobs) > 0 for g in gens)


def _settings(server: Any, smollm2_dir: Path, tmp_path: Path, probes: Path) -> Settings:
    retrain = RetrainConfig(steps=1, rollouts=2, batch_questions=1, max_token_caps=16, probe_questions=probes,
                            probe_samples=1, min_new_sessions=2, unload_grace_s=0)
    agent = AgentConfig(policy_backend="vllm", policy_base_url=server.url, policy_model="policy",
                        embedded_model_path=smollm2_dir, defaults=SMALL, policy_max_retries=1,
                        local_search_k=2, snippet_chars=300)  # short tool outputs: the flow is under test
    settings = Settings(agent=agent, store=StoreConfig(data_dir=tmp_path / "data"),
                        learning=LearningConfig(retrain=retrain))
    seed_passages(settings)
    return settings


def test_without_runtime_updating_and_when_killed_mid_session_the_errors_say_what_to_do(smollm2_dir: Path,
                                                                                        tmp_path: Path) -> None:
    """A server of its own, started without runtime LoRA updating: loading or unloading an adapter is refused with the
    setting named, and the sleep routes (a GPU and dev-mode feature) with theirs. Then SIGKILL it while a session's
    request runs: the session ends failed, with an error that says the server cannot be reached and names the command
    that starts one; nothing hangs."""
    from app.container import build
    from tests.conftest import start_real_vllm

    server: Any = start_real_vllm(smollm2_dir, tmp_path, runtime_lora=False)

    async def load() -> str:
        client = VLLMPolicyClient(server.url, "policy", max_retries=0)
        try:
            with pytest.raises(PolicyRequestError) as err:
                await client.aload_adapter(SHIPPED_SFT_ADAPTER, "policy@1")
            assert client.model == "policy"
            with pytest.raises(PolicyRequestError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING=1"):
                await client.unload_lora_adapter("policy@1")
            for call in (client.sleep(), client.wake_up(), client.is_sleeping()):  # sleep mode: GPU and dev mode
                with pytest.raises(PolicyRequestError, match="VLLM_SERVER_DEV_MODE=1"):
                    await call
            return str(err.value)
        finally:
            await client.aclose()

    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1" in asyncio.run(load())
    settings = _settings(server, smollm2_dir, tmp_path, tmp_path / "unused.txt")
    options = SMALL.model_copy(update={"token_caps": StageTokenCaps(plan=400, research=64, review=64, answer=64)})
    killer = threading.Thread(target=lambda: (_wait_running(server, 1), server.kill()), daemon=True)

    async def go() -> tuple[str | None, BaseException | None]:
        services = build(settings)
        try:
            out = await services.research.run("Who was Haymo of Faversham?", options)
            return out.session_id, None
        except Exception as exc:  # noqa: BLE001 - the failure is what this test reads
            return None, exc
        finally:
            await services.policy.aclose()

    try:
        killer.start()
        began = time.monotonic()
        sid, exc = asyncio.run(go())
        took = time.monotonic() - began
    finally:
        server.stop()
    killer.join(timeout=5)
    assert exc is not None and sid is None, "the session should have failed"
    assert took < 300  # bounded by the client's retries, not a hang
    text = f"{type(exc).__name__}: {exc}"
    assert "cannot reach the policy server" in text and "rubricem policy-server" in text, text
    recs = SessionLog(settings.store.sqlite_path).list_sessions(limit=10)
    assert [r.status for r in recs] == ["failed"]


# --- every swap is verified; adapters survive a restart (issue 63) ----------------------------------------------------


def _cli_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, url: str, smollm2_dir: Path) -> Settings:
    """A clean RUBRICEM_* environment for `rubricem` commands against the vLLM at `url` (the trainer's model for the
    swap probe is the one it serves)."""
    import os

    for name in [n for n in os.environ if n.startswith("RUBRICEM_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    for key, value in {"STORE__DATA_DIR": str(tmp_path / "data"), "AGENT__POLICY_BACKEND": "vllm",
                       "AGENT__POLICY_BASE_URL": url, "AGENT__POLICY_MODEL": "policy",
                       "AGENT__EMBEDDED_MODEL_PATH": str(smollm2_dir), "AGENT__POLICY_MAX_RETRIES": "1",
                       "AGENT__DEFAULTS__TOKEN_CAPS__PLAN": "24", "AGENT__DEFAULTS__TOKEN_CAPS__RESEARCH": "16",
                       "AGENT__DEFAULTS__TOKEN_CAPS__REVIEW": "16", "AGENT__DEFAULTS__TOKEN_CAPS__ANSWER": "24",
                       "AGENT__LOCAL_SEARCH_K": "2", "AGENT__SNIPPET_CHARS": "300",
                       "LEARNING__RETRAIN__UNLOAD_GRACE_S": "0"}.items():
        monkeypatch.setenv(f"RUBRICEM_{key}", value)
    settings = Settings()
    seed_passages(settings)
    return settings


@pytest.mark.timeout(900)  # two probe readings per version and the trainer's reference; not measured yet
def test_a_stale_adapter_on_vllm_fails_the_swap_probe_and_is_not_promoted(
        real_vllm: Any, smollm2_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM keys a loaded adapter by name: `policy@2` was loaded from its folder while the folder still held the
    previous version's files, then the folder got the new weights. `/v1/models` lists it from the right folder, so
    the load check passes, and vLLM keeps sampling the old weights. `rubricem promote` runs the swap probe: the
    reading under policy@2 equals the one under policy@1 and is far from the trainer's policy@2, so live stays, the
    error names the engine, the replica and both distances, and policy@2 is taken off the server; promoting again
    loads the new weights afresh, passes, and moves live."""
    from app.cli import main
    from tests.adapters import scaled_adapter, served_adapters

    settings = _cli_env(monkeypatch, tmp_path, real_vllm.url, smollm2_dir)
    reg = Registry(SessionLog(settings.store.sqlite_path))
    one = scaled_adapter(SHIPPED_SFT_ADAPTER, tmp_path / "one", 0.5)
    two = tmp_path / "two"
    try:
        v1 = reg.register(one, parent="base")
        assert main(["promote", v1.name]) == 0
        assert f"swap to {v1.name} verified on vllm {real_vllm.url}" in capsys.readouterr().err
        shutil.copytree(one, two)  # the folder as vLLM read it: the previous version's files
        v2 = reg.register(two, parent=v1.name)
        httpx.post(f"{real_vllm.url}/v1/load_lora_adapter", json={"lora_name": v2.name, "lora_path": str(two)},
                   timeout=300).raise_for_status()
        httpx.post(f"{real_vllm.url}/v1/completions", json={"model": v2.name, "prompt": "Hello", "max_tokens": 1},
                   timeout=300).raise_for_status()  # the engine holds these weights now, whatever it reads lazily
        shutil.rmtree(two)
        scaled_adapter(SHIPPED_SFT_ADAPTER, two, 2.0)  # the new weights, under the same folder and name
        assert served_adapters(real_vllm)[v2.name] == str(two)

        assert main(["promote", v2.name]) == 1
        err = capsys.readouterr().err
        assert f"SwapNotVerified: the swap to {v2.name} is not verified on vllm replica {real_vllm.url}" in err
        assert f"distance to the trainer's {v2.name}:" in err and f"distance to the previous version {v1.name}:" in err
        assert "still serves the previous weights" in err and f"{v2.name} is not promoted" in err
        assert reg.live().name == v1.name and v2.name not in served_adapters(real_vllm)

        assert main(["promote", v2.name]) == 0  # loaded afresh from its folder now: the new weights serve
        out, err = capsys.readouterr()
        assert f"live: {v1.name} -> {v2.name}" in out and f"swap to {v2.name} verified" in err
        assert reg.live().name == v2.name
    finally:
        unload_adapters(real_vllm)


@pytest.mark.timeout(1200)  # starts a vLLM of its own twice; not measured yet
def test_after_a_vllm_restart_the_next_team_session_is_served_by_its_adapter(
        smollm2_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server of its own, restarted on its port (vLLM forgets runtime-loaded adapters). The service process lives
    on across the restart (it loaded the team's adapter once and remembers that): the next session of the team's
    member is served by the team's adapter, by name in the server's own request log, not a 404 and not the global
    policy; so is a session of a new service process."""
    from app.cli import main
    from app.container import build
    from store.owner import acting_as
    from store.teams import Teams
    from store.users import Users
    from tests.adapters import scaled_adapter, served_adapters
    from tests.conftest import start_real_vllm
    from tests.app.test_vllm_teams import logged_requests

    server: Any = start_real_vllm(smollm2_dir, tmp_path / "first", extra_args=("--enable-log-requests",))
    try:
        settings = _cli_env(monkeypatch, tmp_path, server.url, smollm2_dir)
        log = SessionLog(settings.store.sqlite_path)
        reg, teams = Registry(log), Teams(log)
        Users(log).add("alice", password="alice's password", consent=True)
        teams.add("law")
        teams.assign("alice", "law")
        law = reg.register(scaled_adapter(SHIPPED_SFT_ADAPTER, tmp_path / "law1", 0.5), parent="base", team="law")
        assert main(["promote", law.name]) == 0  # loaded on the server, swap verified, then law's alias moves
        assert reg.live("law").name == law.name

        async def sessions() -> list[str]:
            nonlocal server
            services = build(settings)

            async def ask(seed: int) -> str:
                with acting_as("alice"):
                    options = SMALL.model_copy(update={"seed": seed})
                    return (await services.research.run("Who was Haymo of Faversham?", options,
                                                        source="chat")).session_id

            try:
                first = await ask(1_000)
                port = server.spec.port
                await asyncio.to_thread(server.stop)
                server = await asyncio.to_thread(start_real_vllm, smollm2_dir, tmp_path / "second", port=port,
                                                 extra_args=("--enable-log-requests",))
                assert served_adapters(server) == {}  # the restart lost the runtime-loaded adapter
                return [first, await ask(2_000)]
            finally:
                await services.policy.aclose()

        sids = asyncio.run(sessions())
        fresh = build(settings)  # a new service process after the restart: served the same way

        async def third() -> str:  # one event loop for the session and the client's close (its pool belongs to it)
            try:
                with acting_as("alice"):
                    return (await fresh.research.run("What is the Franciscan order?",
                                                     SMALL.model_copy(update={"seed": 3_000}),
                                                     source="chat")).session_id
            finally:
                await fresh.policy.aclose()

        sids.append(asyncio.run(third()))
        for sid in sids:
            rec = log.get(sid)
            assert rec.status == "completed" and rec.policy_version == law.name and rec.team == "law"
            assert rec.metrics["serving"]["warning"] is None
            assert {t.policy_version for t in rec.trajectory.turns if t.kind == "sampled"} == {law.name}
        logged = logged_requests(server, 0)  # the restarted server's own log: every request on law's adapter
        assert logged and {adapter for _, adapter in logged} == {law.name}
        assert served_adapters(server) == {law.name: str(law.adapter_path)}
    finally:
        server.stop()
