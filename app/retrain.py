"""Composition of the retraining cycle: which judge trains, which judges the gate, how a version is probed, trained,
and activated on the configured backend (embedded in-process, or vLLM with runtime LoRA loading).

Every swap to a new version is verified before anything is answered by it (issue 63, `learning.swap_verify`): the
candidate before the gate's probe sessions, and the version a promotion or rollback makes live before the alias
moves, on the in-process engine or on every vLLM replica. A swap that fails the probe raises `SwapNotVerified`
(naming the engine, the replica and both distances); on vLLM the version is then taken off the replicas again unless
something still serves it, so it stays out of service."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import Any

from agent.config import RunOptions, StageTokenCaps
from agent.policy import PinnedPolicy, ReplicaSet
from agent.protocols import Served
from agent.sequence import MIN_NEW_TOKENS
from app.container import (
    ConfigurationError,
    Say,
    base_adapter,
    build_judge,
    build_policy,
    enable_tracing,
    ensure_corpus,
    open_index,
)
from app.service import ResearchService, adapter_version
from app.settings import Settings
from learning.evaluate import Probe
from learning.pipeline import RetrainParts
from learning.swap_probe import ProbeDistances, SwapNotVerified
from learning.swap_verify import ProbeVersion, TrainerReference, probe_targets, verify_swap
from learning.train_config import load_config
from store.records import Trajectory
from store.registry import Cycle, PolicyVersion, Registry, team_version_prefix
from store.session_log import SessionLog

_log = logging.getLogger(__name__)
PROBE_COUNT = 4


def deletion_copies(settings: Settings, bank: Any | None) -> Any:
    """Where a deletion finds copies of people's data on this host (`store.deletion.Copies`): the cycles' run
    folders, their run collections (through `bank`; None when it is unreachable) and the judge's answer cache."""
    from store.deletion import Copies

    cache = (settings.learning.cache_dir or settings.store.data_dir / "judge-cache") \
        if settings.learning.judge.cache else None
    return Copies(settings.store.data_dir / "runs", cache, bank, scratch=gate_scratch(settings))


def gate_scratch(settings: Settings) -> tuple[Path, ...]:
    """The promotion gate's scratch files: its probe sessions and its judge's fresh rubric buffers. A team's gate
    asks the team's own recent questions (issue 49), so every deletion removes both (`store.deletion.Copies`)."""
    data = settings.store.data_dir
    return data / "retrain" / "probes.sqlite3", data / "gate-rubrics.sqlite3"


def purge_runs(settings: Settings, log: SessionLog, say: Say = lambda _m: None) -> Any:
    """After a cycle (under the cycle lock): keep the run folders and run collections of the newest
    `keep_run_folders` finished cycles, remove older ones, and remove those of every finished cycle a deletion was
    recorded against (one that ran while the deletion committed; the judge cache is emptied again then, as it may
    have been written meanwhile). A failure is said and logged, never raised: the next cycle or deletion retries.
    Returns the `store.deletion.CopiesPurged` of the deletions' part."""
    from app.container import open_bank
    from store.deletion import clear_judge_cache, purge_copies, remove_run_folder
    from store.rubric_bank import BankError

    try:
        bank: Any = open_bank(settings)
    except BankError as exc:
        say(f"the rubric bank is unavailable ({exc}): run collections stay until the next cycle")
        bank = None
    copies = deletion_copies(settings, bank)
    purged = purge_copies(log, copies)
    if purged.run_folders and copies.judge_cache is not None:  # a cycle that held deleted data ended: what it
        cleared, failures = clear_judge_cache(copies.judge_cache)  # judged meanwhile may be in the cache
        purged = dataclasses.replace(purged, cache_entries=cleared, failed=purged.failed + tuple(failures))
    for failure in purged.failed:
        say(f"deletion clean-up: {failure}")
        _log.warning("deletion clean-up: %s", failure)
    keep = settings.learning.retrain.keep_run_folders
    finished = [c.cycle_id for c in Registry(log).cycles(limit=1_000_000_000)
                if c.status != "running" and (copies.runs_dir / c.cycle_id).is_dir()]
    for cycle_id in finished[keep:]:  # newest first
        try:
            remove_run_folder(copies.runs_dir, cycle_id)
            if bank is not None:
                bank.drop_run_collection(cycle_id)
        except (OSError, BankError) as exc:
            say(f"could not remove the run folder or collection of {cycle_id}: {exc}")
            _log.warning("run folder retention: %s: %s", cycle_id, exc)
    return purged


async def prepare_live(policy: Any, settings: Settings, new: PolicyVersion, old: PolicyVersion,
                       serving: Collection[str] = ()) -> list[str]:
    """Before `live` (or a team's alias) moves from `old` to `new` on vLLM: make every replica serve `new`, checked,
    or raise.

    An adapter version is loaded where it is missing and each server's `/v1/models` must list it from its folder
    (`ensure_adapter`; on a `ReplicaSet` all or nothing: if one replica fails, the adapter is unloaded again where
    this call loaded it and `ReplicaError` names the replica). The base version needs no load, but every replica must
    still answer and list the base model, so a replica that is down stops a promotion or rollback to it as well.
    Returns the adapters older than `old` to unload once requests in flight are done (`old` stays for a rollback):
    only versions of the same policy (`policy@N` for the global one, `team:<name>@K` for a team's), and never one in
    `serving` (what the global and every team alias serve now: `live_names`).
    """
    base = settings.agent.policy_model
    if new.adapter_path is not None:
        await policy.ensure_adapter(new.name, new.adapter_path)
    elif base not in await policy.list_models():
        raise ConfigurationError(f"the policy server does not list the base model {base!r} "
                                 "(RUBRICEM_AGENT__POLICY_MODEL must be vLLM's --served-model-name)")
    per_replica = await policy.listed() if isinstance(policy, ReplicaSet) else {"": await policy.list_models()}
    if new.team != old.team:  # a team's first promotion, or its rollback to the global policy: nothing of the
        return []  # other policy is stale because of it
    keep = {new.name, old.name, base, *serving}
    names = {m for listed in per_replica.values() for m in listed}
    prefix = "policy@" if new.team is None else team_version_prefix(new.team)
    return sorted(m for m in names if m.startswith(prefix) and m not in keep)


def live_names(registry: Registry) -> set[str]:
    """Every version still serving: the global live one, each team's own, and the versions of sessions still running
    or paused for approval (a session keeps the version it started on, issue 49, so its adapter must stay loaded)."""
    from store.teams import Teams

    names = {registry.live().name}
    for team in Teams(registry.log).list():
        if team.live_version is not None:
            names.add(team.live_version)
    with registry.log.transaction(write=False) as conn:
        names |= {str(r[0]) for r in conn.execute(
            "SELECT DISTINCT policy_version FROM sessions WHERE status = 'running'").fetchall()}
    return names


async def unload_stale(policy: Any, names: list[str]) -> None:
    """Unload adapters no one is sent any more; a failure is logged (a leftover adapter costs memory only)."""
    for name in names:
        try:
            await policy.unload_lora_adapter(name)
        except Exception as exc:  # noqa: BLE001 - a leftover adapter costs memory, not correctness
            _log.warning("could not unload %s: %s", name, exc)


async def _listed(policy: Any) -> list[str]:
    """Every name any replica serves; none when the server cannot be asked (the unload is best effort)."""
    try:
        if isinstance(policy, ReplicaSet):
            return sorted({m for names in (await policy.listed()).values() for m in names})
        return list(await policy.list_models())
    except Exception as exc:  # noqa: BLE001 - a leftover step adapter costs memory, not correctness
        _log.warning("could not list the served adapters: %s", exc)
        return []


async def serve_version(policy: Any, settings: Settings, version: PolicyVersion) -> None:
    """Make `policy` answer with `version` (load the adapter in-process, or on every vLLM replica)."""
    if settings.agent.policy_backend == "vllm":
        if version.adapter_path is None:
            policy.set_model(settings.agent.policy_model)
            return
        await policy.ensure_adapter(version.name, version.adapter_path)  # a ReplicaSet: on every replica or none
        policy.set_model(version.name)
        return
    start = base_adapter(settings)
    if version.adapter_path is None and start is not None:  # `base` is the deployment's starting adapter
        await policy.aload_adapter(start, adapter_version(start))
    elif version.adapter_path is None:
        await policy.aunload_adapter()
    else:
        await policy.aload_adapter(version.adapter_path, version.name)


def probe_version(settings: Settings, version: PolicyVersion) -> ProbeVersion:
    """How the swap probe addresses `version`: the `Served` pin a session of it would carry (as
    `ResearchService._served` makes it, so that an in-process engine finds the version `serve_version` loaded under
    its own name), and the adapter folder the trainer loads for it."""
    if settings.agent.policy_backend == "vllm":
        model = version.name if version.adapter_path else settings.agent.policy_model
        folder = version.adapter_path
        return ProbeVersion(version.name, Served(model, model, folder), Path(folder) if folder else None)
    start = base_adapter(settings)
    if version.adapter_path is None and start is not None:
        name = adapter_version(start)
        return ProbeVersion(version.name, Served(name, name, str(start)), Path(start))
    if version.adapter_path is None:
        return ProbeVersion(version.name, Served("base", "base", None), None)
    return ProbeVersion(version.name, Served(version.name, version.name, version.adapter_path),
                        Path(version.adapter_path))


def trainer_reference(settings: Settings) -> TrainerReference:
    """The trainer's log-probs for the swap probe: the model training loads (`app.training.build_trainer`'s), in the
    trainer's default dtype (loaded on first use)."""
    from learning.train_config import TrainConfig

    def model_dir() -> Path:
        from learning.engines.weights import ensure_converted

        return settings.agent.embedded_model_path or ensure_converted(settings.store.model_cache)

    return TrainerReference(model_dir, dtype=TrainConfig().dtype)


def swaps_verified(settings: Settings) -> bool:
    """Whether the backend swaps versions (vLLM's runtime LoRA, the embedded engines); a llama.cpp server serves the
    weights it was started with, so nothing is swapped there."""
    return settings.agent.policy_backend in ("vllm", "embedded")


async def verify_served_swap(policy: Any, settings: Settings, new: PolicyVersion, old: PolicyVersion,
                             reference: TrainerReference, swap: Callable[[], Awaitable[object]],
                             serving: Collection[str] = ()) -> dict[str, ProbeDistances]:
    """Run `swap` (which makes `policy` serve `new`) under the swap probe against `old` (`learning.swap_verify`),
    on every vLLM replica or on the in-process engine.

    On vLLM, a swap that fails the probe after it ran takes `new` off every replica again, unless it is in `serving`
    (what still serves: `live_names`), so a later attempt loads it afresh rather than finding the stale copy listed;
    a probe that failed before the swap (the previous version could not be read) leaves every replica as it was.

    Raises:
        SwapNotVerified: the probe failed or could not run before its deadline (the message says where and why).
        Whatever `swap` raises (a replica that refused the load: ReplicaError).
    """
    cfg = settings.learning.retrain
    try:
        return await verify_swap(probe_targets(policy), probe_version(settings, new), probe_version(settings, old),
                                 reference, swap=swap, tolerance=cfg.swap_probe_max_kl,
                                 deadline_s=cfg.swap_probe_deadline_s, tokens=cfg.swap_probe_tokens)
    except SwapNotVerified as exc:
        if exc.after_swap and settings.agent.policy_backend == "vllm" and new.adapter_path is not None \
                and new.name not in serving:
            await unload_stale(policy, [new.name])
        raise


async def activate_verified(policy: Any, settings: Settings, new: PolicyVersion, old: PolicyVersion,
                            reference: TrainerReference, serving: Collection[str]) -> tuple[dict[str, ProbeDistances],
                                                                                            list[str]]:
    """Make `policy` serve `new` under the swap probe against `old`, before the alias moves: on vLLM every replica
    loads it (`prepare_live`), on the embedded backend this process's engine does (`serve_version`).

    Returns:
        The probe's distances per engine or replica, and the adapters `prepare_live` found stale (to unload after
        the grace period; none on the embedded backend).

    Raises:
        As `verify_served_swap`.
    """
    stale: list[str] = []

    async def swap() -> None:
        if settings.agent.policy_backend == "vllm":
            stale.extend(await prepare_live(policy, settings, new, old, serving))
        else:
            await serve_version(policy, settings, new)

    checks = await verify_served_swap(policy, settings, new, old, reference, swap, serving)
    return checks, stale


def rollback_target(registry: Registry, team: str | None = None) -> PolicyVersion:
    """The version `Registry.rollback` would make live, found without moving `live` (the same rule: the version the
    promotion of the current live one replaced, rollbacks skipped), so it can be loaded everywhere first. For a team
    whose rollback returns it to the global policy, that is the global live version.

    Raises:
        RegistryError: nothing to roll back to.
    """
    target = registry.rollback_target(team)
    return registry.live() if target is None else target


def probe_questions(settings: Settings) -> list[str]:
    """The fixed probe set: the configured file, else 4 bundled questions disjoint from the default training pool."""
    from learning.questions import bundled_questions, load_questions

    path = settings.learning.retrain.probe_questions
    if path is not None:
        return load_questions(path, minimum=1)
    return bundled_questions(PROBE_COUNT, seed=97_531)  # another seed than training's default pool (seed 0)


def _held_out_judge(settings: Settings, log: SessionLog) -> Any:
    """The gate's judge: never the training judge's rubric buffers; another model when configured (LLM judge)."""
    retrain = settings.learning.retrain
    if settings.learning.judge.base_url:
        from app.container import build_judge_client
        from learning.judge.llm import LLMJudge

        model = retrain.eval_judge_model or settings.learning.judge.model
        gate_settings = settings.model_copy(update={"learning": settings.learning.model_copy(update={
            "judge": settings.learning.judge.model_copy(update={"model": model})})})
        # Fresh rubric buffers, not training's: a local scratch file beside the store, whichever backend it uses.
        gate_log = SessionLog(gate_scratch(settings)[1])
        return LLMJudge(build_judge_client(gate_settings), gate_log,
                        trajectory_chars=settings.learning.judge.trajectory_chars)
    from learning.judge.offline import OfflineJudge

    return OfflineJudge(None, embedding_model=settings.store.embedding_model)  # the question + checklist only


def probe_options(settings: Settings) -> RunOptions:
    """Probe runs: the app's defaults, greedy, without the bank (the gate measures the policy)."""
    caps = settings.learning.retrain.max_token_caps
    return settings.agent.defaults.model_copy(update={
        "temperature": 0.0, "inject_bank": False, "max_tool_calls": 2,
        # research at least MIN_NEW_TOKENS, as in training: half of a 16-token cap failed every probe run
        "token_caps": StageTokenCaps(plan=caps, research=max(MIN_NEW_TOKENS, caps // 2), review=caps, answer=caps)})


class RetrainApp:
    """Builds RetrainParts for the configured backend and keeps the clients it opened, to close them."""

    def __init__(self, settings: Settings, say: Say = lambda _m: None) -> None:
        """Open the session log, registry, judges and (lazily) the probe policy."""
        enable_tracing(settings)  # the cycle's spans (learning.pipeline.retrain) are exported like a session's
        self.settings, self.say = settings, say
        self.log = SessionLog.from_config(settings.store)
        self.registry = Registry(self.log)
        self.index = open_index(settings)
        ensure_corpus(self.index, say)
        self._probe_policy: Any = None
        self._reference: TrainerReference | None = None
        self._pending: list[asyncio.Task[None]] = []

    def parts(self) -> RetrainParts:
        """Everything the cycle needs."""
        cfg = self.settings.learning.retrain
        from learning.eval.heldout import heldout_index, load_heldout
        from learning.questions import load_questions

        seed = load_questions(cfg.seed_questions) if cfg.seed_questions else []
        vllm = self.settings.agent.policy_backend == "vllm"
        return RetrainParts(
            log=self.log, registry=self.registry, judge=build_judge(self.settings, self.log, self.say),
            gate_judge=_held_out_judge(self.settings, self.log), train=self.train, probe_for=self.probe_for,
            activate=self.activate, adapters_dir=self.settings.store.data_dir / "runs" / "adapters",
            probe_questions=probe_questions(self.settings), seed_questions=seed,
            heldout=heldout_index(load_heldout()),
            sleep=self._sleep if vllm else None, wake=self._wake if vllm else None, concurrent_probes=vllm)

    async def train(self, cycle: Cycle, questions: list[str], live: PolicyVersion) -> Path:
        """SS-GRPO from the live adapter on the cycle's questions; returns the final adapter folder."""
        from app.training import build_trainer
        from learning.grpo import train

        r = self.settings.learning.retrain
        run_dir = self.settings.store.data_dir / "runs" / cycle.cycle_id
        run_dir.mkdir(parents=True, exist_ok=True)
        qfile = run_dir / "questions.jsonl"
        qfile.write_text("".join(json.dumps({"question": q}) + "\n" for q in questions))
        caps = r.max_token_caps
        cfg = load_config(None, None, name=cycle.cycle_id, out_dir=run_dir, questions=qfile, steps=r.steps,
                          rollouts=r.rollouts, batch_questions=min(r.batch_questions, len(questions)), lr=r.lr,
                          init_adapter=Path(live.adapter_path) if live.adapter_path else base_adapter(self.settings),
                          plan_tokens=caps,
                          research_tokens=max(16, caps // 2), review_tokens=caps, answer_tokens=caps,
                          max_tool_calls=2, reflection_candidates=2, reflection_tokens=max(16, caps),
                          curriculum_window=1)
        # Rollouts are served by the configured vLLM (each step's adapter loaded into it as CYCLE@STEP, a group's
        # rollouts sent at once so continuous batching serves them). In one-GPU mode vLLM sleeps while training, so
        # the rollouts run on the embedded backend in this process instead.
        on_vllm = self.settings.agent.policy_backend == "vllm" and not r.sleep_policy_server
        train_settings = self.settings if on_vllm else self.settings.model_copy(update={
            "agent": self.settings.agent.model_copy(update={"policy_backend": "embedded"})})
        parts, folder = build_trainer(train_settings, cfg, self.say)
        try:
            summary = await train(cfg, parts, folder, progress=lambda row: self.say(
                str(row.get("message") or f"  step {row['step'] + 1}/{cfg.steps}: loss {row['task/loss']:+.4f}")))
        finally:
            if on_vllm:  # the run's step adapters leave the server; the candidate is loaded under its own name
                await unload_stale(parts.policy, [m for m in await _listed(parts.policy)
                                                  if m.startswith(f"{cycle.cycle_id}@")])
            await parts.policy.aclose()
        if summary.adapter is None:
            raise RuntimeError("training produced no adapter")
        return summary.adapter

    def _policy(self) -> Any:
        """The cycle's own client of the serving backend (probes, adapter loads, sleep/wake), opened once."""
        if self._probe_policy is None:
            self._probe_policy = build_policy(self.settings, self.say)
        return self._probe_policy

    def _trainer(self) -> TrainerReference:
        """The swap probe's trainer reference, loaded once per cycle."""
        if self._reference is None:
            self._reference = trainer_reference(self.settings)
        return self._reference

    async def probe_for(self, version: PolicyVersion) -> Probe:
        """A function that researches a probe question with `version` (fresh probe log, no bank). A candidate is
        swapped in under the swap probe against the live version it would replace, so no probe session is recorded
        under a version that did not serve it (SwapNotVerified fails the cycle)."""
        policy = self._policy()
        if version.status == "candidate" and swaps_verified(self.settings):
            live = self.registry.live(version.team)
            checks = await verify_served_swap(policy, self.settings, version, live, self._trainer(),
                                              lambda: serve_version(policy, self.settings, version),
                                              live_names(self.registry))
            self.say(f"swap to {version.name} verified on {', '.join(checks)}")
        else:
            await serve_version(policy, self.settings, version)
        from agent.tools.registry import build_tools

        log = SessionLog(gate_scratch(self.settings)[0])
        # vLLM: each probe session names its version in every request (the gate runs both versions' sessions at
        # once, `RetrainParts.concurrent_probes`), whatever the shared client was last told to serve.
        served = PinnedPolicy(policy, probe_version(self.settings, version).served) \
            if self.settings.agent.policy_backend == "vllm" else policy
        service = ResearchService(served, build_tools(self.settings.agent, self.index), log, self.settings.agent)
        options = probe_options(self.settings)

        async def probe(question: str, seed: int) -> Trajectory:
            out = await service.run(question, options.model_copy(update={"seed": seed}), source="probe")
            return out.trajectory

        return probe

    async def activate(self, new: PolicyVersion, old: PolicyVersion) -> None:
        """Make `new` servable, verified, before the alias flips. vLLM: every replica serves it, checked
        (`prepare_live`; a failed replica raises ReplicaError and the cycle fails with it named), and passes the swap
        probe against `old` (SwapNotVerified names the replica and both distances; the adapter is taken off again);
        adapters older than `old` are unloaded after the grace period (old stays loaded for a rollback). Embedded:
        the swap is probed on this process's engine of the same configuration (serving processes load it
        themselves)."""
        if not swaps_verified(self.settings):
            return
        policy = self._policy()
        checks, stale = await activate_verified(policy, self.settings, new, old, self._trainer(),
                                                live_names(self.registry))
        self.say(f"swap to {new.name} verified on {', '.join(checks)}")
        if stale:
            self._pending.append(asyncio.create_task(self._unload_later(policy, stale)))

    async def _unload_later(self, policy: Any, names: list[str]) -> None:
        await asyncio.sleep(self.settings.learning.retrain.unload_grace_s)  # requests in flight finish first
        await unload_stale(policy, names)

    async def _sleep(self) -> None:
        self.say("one-GPU mode: putting the vLLM server to sleep for training")
        await self._policy().sleep(level=1)

    async def _wake(self) -> None:
        self.say("waking the vLLM server")
        await self._policy().wake_up()

    async def aclose(self) -> None:
        """Finish pending unloads, close clients, then apply run-folder retention and finish deletions' clean-up of
        cycles that have ended (`purge_runs`; the caller holds the cycle lock)."""
        if self._pending:
            self.say(f"waiting {self.settings.learning.retrain.unload_grace_s:.0f}s before unloading old adapters")
            await asyncio.gather(*self._pending, return_exceptions=True)
        if self._probe_policy is not None:
            await self._probe_policy.aclose()
        if self._reference is not None:
            self._reference.close()
        await asyncio.to_thread(purge_runs, self.settings, self.log, self.say)
