"""The retraining cycle: logged sessions → judge → SS-GRPO from the live version → candidate → gate → promote or
reject, every stage recorded in the registry so a crash resumes where it stopped.

Stages (the cycle row's `stage` after each): start → judged → trained → registered → evaluated → done.
- judged: completed, non-opted-out sessions of the cycle's window are judged (failures are recorded per session).
- trained: SS-GRPO + reflection steps from the live adapter on the window's questions (plus the seed set); the run
  folder is named after the cycle, so a crashed training resumes from its own checkpoint.
- registered: the adapter is copied atomically into the adapters folder and registered as `policy@N` (candidate).
- evaluated: non-finite weights are rejected outright; otherwise candidate and live answer the probe set and the
  held-out judge decides (learning/evaluate.py).
- done: promoted (the activation hook loads it where it is served, then the live alias flips) or rejected with a
  reason. The live alias only ever moves in one SQLite transaction, after the adapter is complete and loaded.

A team's cycle (issue 49, `team=`) runs the same stages over that team's own sessions only, from the team's live
version (the global one while the team has none), registers `team:<name>@K`, and is gated twice: on the team's own
recent questions, and on the global probe set, where it may not get worse than the version the team is served now
beyond the tolerance (`learning.evaluate.team_gate`). Promotion moves the team's alias only. A team cycle never runs
without the team's own data (issue 65): with no question of the team's own in its window it trains nothing (NoTeamData,
recorded as skipped with the reason, and raised so `retrain --now --team` fails saying so), rather than training a
"team" version on the seed set alone; and a candidate whose team has no question left to be gated on (its sessions
deleted or opted out since training) is rejected, never promoted on the global half of the gate alone.
An exception marks the cycle failed (live untouched; a policy replica that failed to load the candidate is listed
in the cycle's numbers as `failed_replicas`, a swap that failed its probe (issue 63: the candidate before the gate,
the promoted version in `activate`) as `swap_probe`, with the engine, the replica and both distances); a killed
process leaves it running, and the next call resumes.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent import telemetry
from agent.errors import ReplicaError
from learning.config import RetrainConfig
from learning.errors import LearningError
from learning.eval.heldout import heldout_ids, normalize_question
from learning.evaluate import (GateReport, Probe, adapter_problem, decide, no_team_questions_reason,
                               VersionScore, score_version, team_gate)
from learning.judge.pipeline import judge_pending
from learning.judge.types import TrajectoryJudge
from learning.swap_probe import SwapNotVerified
from store.registry import Cycle, PolicyVersion, Registry, RegistryError
from store.session_log import SessionLog

Say = Callable[[str], None]
_log = logging.getLogger(__name__)


class NoTeamData(LearningError):
    """A team's cycle found no question of the team's own to train on: nothing was trained (the message says why and
    what to do). A team's version learns from its own people's sessions, never from the seed set alone."""


@dataclass
class RetrainParts:
    """What a cycle uses, built by the app."""

    log: SessionLog
    registry: Registry
    judge: TrajectoryJudge  # the training judge (stored judgements of user sessions)
    gate_judge: TrajectoryJudge  # the held-out judge configuration
    train: Callable[[Cycle, list[str], PolicyVersion], Awaitable[Path]]  # → the trained adapter folder
    probe_for: Callable[[PolicyVersion], Awaitable[Probe]]  # a probe function answering with that version
    activate: Callable[[PolicyVersion, PolicyVersion], Awaitable[None]]  # (new, old): serve new; old stays for rollback
    adapters_dir: Path
    probe_questions: list[str]
    seed_questions: list[str]
    sleep: Callable[[], Awaitable[None]] | None = None  # one-GPU mode: free the GPU for training
    wake: Callable[[], Awaitable[None]] | None = None
    heldout: Mapping[str, str] = field(default_factory=dict)  # normalised held-out question -> id: never trained on
    # The gate's probe sessions of different versions may run at once: each of them pins its version per request (an
    # HTTP server such as vLLM, which batches them). An in-process engine holds one adapter at a time, so there they
    # run one version after the other, as swapping adapters per request would only add swaps.
    concurrent_probes: bool = False


@dataclass(frozen=True, slots=True)
class CycleResult:
    """How a cycle ended."""

    cycle: Cycle
    candidate: str | None
    gate: GateReport | None
    message: str


async def retrain(parts: RetrainParts, cfg: RetrainConfig, *, trigger: str = "cli", force: bool = True,
                  say: Say = lambda _m: None, team: str | None = None) -> CycleResult:
    """Run (or resume) one cycle of the global policy, or of `team`'s; `force=False` (the scheduler) skips it below
    `min_new_sessions` new sessions. A cycle a crash left running is resumed first, whichever policy it trains."""
    reg = parts.registry
    cycle = reg.running_cycle()
    if cycle is not None:
        say(f"resuming {cycle.cycle_id}{_of(cycle.team)} after stage {cycle.stage}")
    else:
        cycle = reg.start_cycle(trigger, parts.log.now(), team=team)
    try:
        parent = reg.live(cycle.team).name
    except RegistryError as exc:  # its team is gone (`Teams.remove` refuses while its cycle runs): never resumable
        reg.finish_cycle(cycle.cycle_id, "failed", error=f"{type(exc).__name__}: {exc}")
        telemetry.cycle_finished("failed")
        raise
    # One span per cycle with a span per phase (issue 36), and the cycle counted by outcome when it ends.
    with telemetry.cycle_span(cycle.cycle_id, parent_version=parent) as span:
        telemetry.set_attrs(span, {"rubricem.cycle.trigger": trigger, "rubricem.cycle.resumed_after": (
            cycle.stage if cycle.stage != "start" else None)})
        try:
            result = await _run(parts, cfg, cycle, force, say)
        except NoTeamData as exc:  # a refusal, not a fault: recorded as skipped with the reason, and raised
            reg.finish_cycle(cycle.cycle_id, "skipped", error=str(exc))
            telemetry.cycle_finished("skipped")
            raise
        except BaseException as exc:
            if isinstance(exc, Exception):
                # A policy replica that failed a load (probe or promotion) is named in the record, not only the
                # message.
                numbers = {"failed_replicas": sorted(exc.failures)} if isinstance(exc, ReplicaError) else None
                if isinstance(exc, SwapNotVerified):  # where the swap probe failed, with both distances
                    numbers = {"swap_probe": exc.record()}
                error = f"{type(exc).__name__}: {exc}"
                # Kept for the operator (the registry, the trainer's log); the Learning page shows the cycle id only.
                _log.error("retraining cycle %s failed: %s", cycle.cycle_id, error)
                reg.finish_cycle(cycle.cycle_id, "failed", error=error, numbers=numbers)
                telemetry.cycle_finished("failed")
            raise  # KeyboardInterrupt and kills leave the cycle running: the next call resumes it
        telemetry.set_attrs(span, {"rubricem.cycle.outcome": result.cycle.status,
                                   "rubricem.cycle.candidate": result.candidate})
    telemetry.cycle_finished(result.cycle.status)
    return result


def _of(team: str | None) -> str:
    return "" if team is None else f" (team {team})"


async def _run(parts: RetrainParts, cfg: RetrainConfig, cycle: Cycle, force: bool, say: Say) -> CycleResult:
    reg = parts.registry
    team = cycle.team
    sessions = reg.sessions_in_window(cycle.window_start, cycle.window_end, team=team)
    if cycle.stage == "start":
        if not force and len(sessions) < cfg.min_new_sessions:
            done = reg.finish_cycle(cycle.cycle_id, "skipped", numbers={"new_sessions": len(sessions)},
                                    error=f"{len(sessions)} new session(s){_of(team)} < min_new_sessions "
                                          f"{cfg.min_new_sessions}")
            return CycleResult(done, None, None, done.error or "skipped")
    if team is not None and cycle.stage in ("start", "judged"):  # before judging or training anything for it
        require_team_questions(team, parts.log, sessions, parts.heldout)
    if cycle.stage == "start":
        began = time.monotonic()
        with telemetry.phase_span("judge"):
            judged = await judge_pending(parts.log, parts.judge, progress=say)
        cycle = reg.advance_cycle(cycle.cycle_id, "judged", numbers={
            "new_sessions": len(sessions), "judged": judged.judged, "judge_failures": judged.failed,
            "skipped_sessions": reg.skipped_in_window(cycle.window_start, cycle.window_end, team=team),
            "judge_seconds": round(time.monotonic() - began, 1)})
    live = reg.live(team)  # a team without a version of its own starts from the global live one
    if cycle.stage == "judged":
        questions = training_questions(parts.log, sessions, parts.seed_questions, parts.heldout, say)
        if len(questions) < 2:
            done = reg.finish_cycle(cycle.cycle_id, "skipped", error=f"only {len(questions)} distinct question(s)")
            return CycleResult(done, None, None, done.error or "skipped")
        say(f"training{_of(team)} from {live.name} on {len(questions)} question(s)")
        with telemetry.phase_span("train"):
            if cfg.sleep_policy_server and parts.sleep is not None:
                await parts.sleep()  # one GPU: the server's weights and KV cache leave GPU memory while we train
            began = time.monotonic()
            try:
                adapter = await parts.train(cycle, questions, live)
            finally:
                if cfg.sleep_policy_server and parts.wake is not None:
                    await parts.wake()
        cycle = reg.advance_cycle(cycle.cycle_id, "trained", numbers={
            "questions": len(questions), "trained_adapter": str(adapter),
            "train_seconds": round(time.monotonic() - began, 1)})
    if cycle.stage == "trained":
        staged = _stage_adapter(Path(cycle.numbers["trained_adapter"]), parts.adapters_dir, cycle.cycle_id)
        version = reg.register(staged, parent=live.name, training_run=cycle.cycle_id, team=team,
                               data_window={"start": cycle.window_start, "end": cycle.window_end,
                                            "sessions": len(sessions)})
        cycle = reg.advance_cycle(cycle.cycle_id, "registered", candidate=version.name)
        say(f"registered {version.name}")
    assert cycle.candidate is not None
    candidate = reg.get(cycle.candidate)
    problem = adapter_problem(Path(candidate.adapter_path or ""))
    if problem is not None:
        reg.reject(candidate.name, problem)
        done = reg.finish_cycle(cycle.cycle_id, "rejected", numbers={"reason": problem})
        return CycleResult(done, candidate.name, None, f"{candidate.name} rejected: {problem}")
    began = time.monotonic()
    own: list[str] = []
    if team is not None:  # the window as it is now: a session deleted or opted out while the cycle trained is not
        current = reg.sessions_in_window(cycle.window_start, cycle.window_end, team=team)  # asked again by the gate
        own = recent_questions(parts.log, current, parts.heldout, len(parts.probe_questions))
    if team is not None and not own:  # the team half of the gate cannot run: never promoted on the global half alone
        reason = no_team_questions_reason(team)  # the UI recognises it by the same template (`learning.evaluate`)
        reg.reject(candidate.name, reason)
        done = reg.finish_cycle(cycle.cycle_id, "rejected", numbers={"reason": reason})
        return CycleResult(done, candidate.name, None, f"{candidate.name} rejected: {reason}")
    with telemetry.phase_span("gate"):
        gate = await _gate(parts, cfg, candidate, live, parts.probe_questions, own)
    reg.set_eval_report(candidate.name, gate.as_dict())
    cycle = reg.advance_cycle(cycle.cycle_id, "evaluated", numbers={
        "candidate_score": gate.candidate.total, "live_score": gate.live.total,
        "gate_seconds": round(time.monotonic() - began, 1)})
    if not gate.promote:
        reg.reject(candidate.name, gate.reason)
        done = reg.finish_cycle(cycle.cycle_id, "rejected", numbers={"reason": gate.reason})
        return CycleResult(done, candidate.name, gate, f"{candidate.name} rejected: {gate.reason}")
    with telemetry.phase_span("promote"):
        await parts.activate(candidate, live)
        reg.promote(candidate.name, gate.reason)
    done = reg.finish_cycle(cycle.cycle_id, "promoted", numbers={"reason": gate.reason})
    return CycleResult(done, candidate.name, gate, f"{candidate.name} promoted: {gate.reason}")


async def _gate(parts: RetrainParts, cfg: RetrainConfig, candidate: PolicyVersion, live: PolicyVersion,
                questions: Sequence[str], own: Sequence[str] = ()) -> GateReport:
    """The candidate against live on the global probe set, and for a team (`own`: its recent questions) on those too
    (`team_gate`). Each version's probe is made once (the candidate's under the swap probe). With
    `parts.concurrent_probes` every probe session of both versions runs at once; otherwise each version's sessions
    run right after its probe is made, since an in-process probe serves whatever version was made last. The same
    runs with the same seeds either way."""
    seed = 20_261_123
    sets = [questions, own] if own else [questions]

    def runs(version: PolicyVersion, probe: Probe) -> list[Awaitable[VersionScore]]:
        return [score_version(version.name, probe, parts.gate_judge, qs, cfg.probe_samples, seed,
                              concurrent=parts.concurrent_probes) for qs in sets]

    scores: list[VersionScore] = []
    if parts.concurrent_probes:
        probes = [(v, await parts.probe_for(v)) for v in (candidate, live)]
        scores = list(await asyncio.gather(*(run for v, p in probes for run in runs(v, p))))
    else:
        for version in (candidate, live):
            probe = await parts.probe_for(version)
            scores += [await run for run in runs(version, probe)]
    mine, theirs = scores[:len(sets)], scores[len(sets):]  # the candidate's per set, then live's
    judge = parts.gate_judge.model or parts.gate_judge.kind
    general = decide(mine[0], theirs[0], cfg.tolerance, judge)
    return team_gate(decide(mine[1], theirs[1], cfg.tolerance, judge), general) if own else general


def require_team_questions(team: str, log: SessionLog, sessions: Sequence[str], heldout: Mapping[str, str]) -> None:
    """Refuse a team cycle whose window holds no question of the team's own (held-out ones do not count, as they
    never train): without this the cycle would train and register a "team" version on the seed set alone.

    Raises:
        NoTeamData: the team has nothing of its own to learn from; the message says why and what to do.
    """
    if any(normalize_question(log.get(sid).question) not in heldout for sid in sessions):
        return
    why = (f"its {len(sessions)} learnable session(s) all ask held-out evaluation questions, which never train"
           if sessions else "it has no completed session of its own since its last cycle whose owner lets it be "
                            "learned from")
    raise NoTeamData(f"team {team} has nothing of its own to train on: {why}. A team's version is trained and gated "
                     "on its own people's questions, never on the seed set alone; ask questions as members of the "
                     f"team (with learning allowed), then run `rubricem retrain --now --team {team}` again")


def recent_questions(log: SessionLog, sessions: Sequence[str], heldout: Mapping[str, str], n: int) -> list[str]:
    """A team gate's own probe set: the newest `n` distinct questions of the team's window (held-out ones left out,
    as in training). They were trained on too: the gate asks whether the candidate answers the team's questions
    better than the version the team is served now, and the global probe set checks it did not get worse at large."""
    out: list[str] = []
    for sid in reversed(sessions):  # the window is oldest first
        q = log.get(sid).question
        if q not in out and normalize_question(q) not in heldout:
            out.append(q)
        if len(out) >= n:
            break
    return out


def training_questions(log: SessionLog, sessions: Sequence[str], seed: Sequence[str], heldout: Mapping[str, str],
                       say: Callable[[str], None] = lambda _m: None) -> list[str]:
    """The cycle's distinct questions (its sessions', then the seed set's), without held-out ones.

    A user may ask an evaluation question (the demo's is one): the session is answered and kept, but its question
    never trains, so the held-out evaluation stays held out. The ids left out are said.
    """
    out: list[str] = []
    for sid in sessions:
        q = log.get(sid).question
        if q not in out:
            out.append(q)
    out += [q for q in seed if q not in out]
    if held := heldout_ids(out, heldout):
        say(f"left out {len(held)} held-out question(s) from training: {', '.join(held)}")
        out = [q for q in out if normalize_question(q) not in heldout]
    return out


def _stage_adapter(trained: Path, adapters_dir: Path, cycle_id: str) -> Path:
    """Copy the trained adapter into the adapters folder under the cycle's name, atomically (idempotent)."""
    final = adapters_dir / cycle_id
    if (final / "adapter_config.json").is_file():
        return final
    tmp = adapters_dir / f".{cycle_id}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    adapters_dir.mkdir(parents=True, exist_ok=True)
    shutil.copytree(trained, tmp)
    tmp.rename(final)
    return final


__all__ = ["CycleResult", "NoTeamData", "RetrainParts", "retrain"]
