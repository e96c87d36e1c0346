"""`rubricem retrain --now`, `versions`, `promote VERSION`, `rollback`, `scheduler`: the online learning loop."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from app.settings import Settings

from store.registry import LIVE

if TYPE_CHECKING:
    from store.registry import AliasChange


def cmd_retrain(args: argparse.Namespace) -> int:
    """Run (or resume) one retraining cycle now."""
    from app.cli.common import Progress
    from app.scheduler import run_cycle

    if not args.now:
        raise ValueError("retrain runs one cycle immediately: pass --now (use `rubricem scheduler` for periodic runs)")
    result = asyncio.run(run_cycle(Settings(), trigger="cli", force=True, say=Progress().say, team=args.team))
    print(f"{result.cycle.cycle_id}: {result.cycle.status} — {result.message}")
    if result.gate is not None:
        print(f"  probe score: candidate {result.gate.candidate.total:.4f} vs live {result.gate.live.total:.4f} "
              f"(tolerance {result.gate.tolerance}, judge {result.gate.judge})")
    return 0


def cmd_versions(args: argparse.Namespace) -> int:
    """Policy versions, the live alias, recent alias moves and cycles."""
    from store.registry import Registry
    from store.session_log import SessionLog

    from store.deletion import versions_trained_on_deleted_data

    from store.teams import Teams

    log = SessionLog.from_config(Settings().store)
    reg = Registry(log)
    live = reg.live().name
    teams = Teams(log).list()
    serving = {live} | {t.live_version for t in teams if t.live_version}
    deleted = versions_trained_on_deleted_data(log)
    for v in reg.versions():
        mark = "*" if v.name in serving else " "
        score = (v.eval_report or {}).get("candidate", {}).get("total")
        # Data deleted later is still inside the adapter; the mark says so (README: People, privacy and consent).
        gone = f"  [trained on data deleted later: {deleted[v.name]} deletion(s)]" if v.name in deleted else ""
        print(f"{mark} {v.name:<12} {v.status:<9} parent {v.parent or '-':<10} {v.created_at[:19]}  "
              f"{'probe ' + format(score, '.4f') if score is not None else '':<13} {v.reason or ''}{gone}")
    if teams:
        print("\nteams (a team without a version of its own is served the global live version):")
        for t in teams:
            print(f"  {t.name:<16} {t.live_version or 'global (' + live + ')'}")
    print("\nalias moves:")
    moves = [*reg.history(limit=args.limit), *(h for t in teams for h in reg.history(limit=args.limit, team=t.name))]
    for h in sorted(moves, key=lambda h: h.created_at, reverse=True)[:args.limit]:
        print(f"  {h.created_at[:19]}  {h.alias:<12} {h.action:<8} {h.previous or LIVE} -> {h.version}  {h.reason}")
    print("\ncycles:")
    for c in reg.cycles(limit=args.limit):
        print(f"  {c.started_at[:19]}  {c.cycle_id}  {c.trigger:<9} {c.status:<9} {c.team or 'global':<12} "
              f"{c.candidate or '-':<14} {c.error or c.numbers.get('reason', '')}")
    return 0


def cmd_promote(args: argparse.Namespace) -> int:
    """Make a version live by hand: it is served everywhere first (every vLLM replica, checked), then `live` moves."""
    from store.registry import Registry
    from store.session_log import SessionLog

    from app.scheduler import cycle_lock

    settings = Settings()
    reg = Registry(SessionLog.from_config(settings.store))
    with cycle_lock(settings.store):  # one move of `live` at a time: a second promotion (or a cycle) is refused
        version = reg.get(args.version)
        old = reg.live(version.team)  # a team's version moves that team's alias only
        change = asyncio.run(_move_live(settings, version, old,
                                        lambda: reg.promote(version.name, args.reason or "promoted by hand")))
    print(f"live: {change.previous} -> {change.version}")
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    """Make the previously live version live again: served everywhere first, then `live` moves back."""
    from app.retrain import rollback_target
    from store.registry import Registry
    from store.session_log import SessionLog

    from app.scheduler import cycle_lock

    settings = Settings()
    reg = Registry(SessionLog.from_config(settings.store))
    reason = args.reason or "rolled back by hand"
    with cycle_lock(settings.store):  # as promote: one move of `live` at a time
        current = reg.live(args.team)
        target = rollback_target(reg, args.team)  # a team's first version rolls back to the global policy
        change = asyncio.run(_move_live(settings, target, current, lambda: reg.rollback(reason, team=args.team)))
    print(f"live: {change.previous} -> {change.version}")
    return 0


async def _move_live(settings: Settings, new: Any, old: Any, flip: Callable[[], AliasChange]) -> AliasChange:
    """Serve `new` where the policy is served, verified, then `flip` the alias, then unload stale adapters after the
    grace.

    On vLLM, `prepare_live` loads `new` on every replica and checks each lists it; if one fails (down, load refused)
    it raises before `flip`, so `live` does not move, and the adapter is unloaded again where it was loaded. Then
    every replica must pass the swap probe against `old` (issue 63: its log-probs on a fixed prompt agree with the
    trainer's for `new` and differ from `old`'s); a failure raises SwapNotVerified naming the replica and both
    distances, before `flip`, and takes `new` off the replicas again. The embedded backend probes the swap on an
    engine of its configuration in this process (serving processes load the live adapter themselves).
    """
    from app.retrain import activate_verified, live_names, swaps_verified, trainer_reference, unload_stale

    if not swaps_verified(settings):
        return flip()
    from app.container import build_policy
    from store.registry import Registry
    from store.session_log import SessionLog

    policy: Any = build_policy(settings)
    reference = trainer_reference(settings)
    try:
        checks, stale = await activate_verified(policy, settings, new, old, reference,
                                                live_names(Registry(SessionLog.from_config(settings.store))))
        print(f"swap to {new.name} verified on {', '.join(checks)}", file=sys.stderr)
        change = flip()
        if stale:
            grace = settings.learning.retrain.unload_grace_s
            print(f"waiting {grace:.0f}s before unloading old adapters {', '.join(stale)}", file=sys.stderr)
            await asyncio.sleep(grace)
            await unload_stale(policy, stale)
        return change
    finally:
        reference.close()
        await policy.aclose()


def cmd_scheduler(args: argparse.Namespace) -> int:
    """Run the retraining scheduler in the foreground (Ctrl-C stops it)."""
    import logging

    from app.scheduler import build_scheduler

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    settings = Settings()
    cfg = settings.learning.retrain
    when = f"every {cfg.interval_minutes:g} min" if cfg.interval_minutes > 0 else f"cron '{cfg.cron}' (UTC)"
    print(f"scheduler: a cycle {when} when at least {cfg.min_new_sessions} new session(s) exist", file=sys.stderr)
    sched = build_scheduler(settings)
    try:
        sched.start()
    except (KeyboardInterrupt, SystemExit):
        pass
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register the loop commands on the main parser."""
    rt = sub.add_parser("retrain", help="judge new sessions, train from the live version, gate and promote")
    rt.add_argument("--now", action="store_true", help="run one cycle now (resumes a crashed one)")
    rt.add_argument("--team", help="train this team's policy on its own sessions (default: the global policy)")
    rt.set_defaults(func=cmd_retrain)
    vs = sub.add_parser("versions", help="policy versions, the live alias, alias moves and retraining cycles")
    vs.add_argument("--limit", type=int, default=10)
    vs.set_defaults(func=cmd_versions)
    pr = sub.add_parser("promote", help="make VERSION live")
    pr.add_argument("version")
    pr.add_argument("--reason")
    pr.set_defaults(func=cmd_promote)
    rb = sub.add_parser("rollback", help="make the previously live version live again")
    rb.add_argument("--reason")
    rb.add_argument("--team", help="roll back this team's policy only (its first version goes back to the global one)")
    rb.set_defaults(func=cmd_rollback)
    sc = sub.add_parser("scheduler", help="run retraining cycles on the configured schedule")
    sc.set_defaults(func=cmd_scheduler)
