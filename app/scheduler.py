"""Periodic retraining: APScheduler runs the cycle on a cron or interval from settings, only with enough new
sessions, never two at once (the cycle lock: an exclusive file lock on DATA_DIR/retrain.lock across the processes of
one host, or a PostgreSQL advisory lock across hosts when the store is PostgreSQL), and every run is recorded in the
registry's cycles (skips included, with their reason).

The scheduler process also serves the Prometheus endpoint (issue 36, `app.metrics`) on
RUBRICEM_TELEMETRY__METRICS_HOST:METRICS_PORT (default 127.0.0.1:9464; port 0 turns it off). It has no token: bind
it to loopback or to a private network (docker/compose.yaml publishes no port for it), see SECURITY.md. It answers
only its own Host names (the bind address, plus RUBRICEM_TELEMETRY__METRICS_ALLOWED_HOSTS), as the MCP server does."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent import telemetry
from app.container import Say
from app.settings import Settings
from store.config import StoreConfig
from store.db import advisory_lock
from store.errors import LockHeld

if TYPE_CHECKING:
    from app.metrics import MetricsServer

_log = logging.getLogger(__name__)


_CYCLE_LOCK = "rubricem.retrain_cycle"


class CycleLocked(RuntimeError):
    """Another process (or, with a PostgreSQL store, another host) is running a retraining cycle."""


@contextlib.contextmanager
def cycle_lock(store: StoreConfig) -> Iterator[None]:
    """Hold the store's cycle lock for one cycle (raises CycleLocked at once if another holds it).

    With a PostgreSQL store it is an advisory lock of that database, held on a connection of its own, so schedulers
    on several hosts share it; it is released when its holder dies (at once with the process, within about a minute
    with the host: `store.db.postgres.advisory_lock`). Otherwise it is DATA_DIR/retrain.lock, for the processes of one
    host.
    """
    with contextlib.ExitStack() as held:
        if store.database_url is None:
            held.enter_context(_file_lock(store.data_dir))
        else:
            try:
                held.enter_context(advisory_lock(store.database_url, _CYCLE_LOCK))
            except LockHeld as exc:
                raise CycleLocked(f"another retraining cycle or promotion is running ({exc})") from exc
        yield


@contextlib.contextmanager
def _file_lock(data_dir: Path) -> Iterator[None]:
    """Hold DATA_DIR/retrain.lock exclusively (flock locks belong to the open file: they are released when the
    holder exits, even if it is killed)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(str(data_dir / "retrain.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise CycleLocked("another retraining cycle or promotion is running (DATA_DIR/retrain.lock is held)") from exc
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        yield
    finally:
        os.close(fd)


async def run_cycle(settings: Settings, *, trigger: str, force: bool, say: Say = lambda _m: None,
                    team: str | None = None) -> Any:
    """One locked cycle (of the global policy, or of `team`'s), or the resumption of the one a crash left running
    (only that: run the command again for the one asked); a locked-out scheduler run is recorded as skipped."""
    results = await run_cycles(settings, trigger=trigger, force=force, say=say, teams=[team], after_resume=False)
    return results[0]


async def run_cycles(settings: Settings, *, trigger: str, force: bool, say: Say = lambda _m: None,
                     teams: list[str | None] | None = None, after_resume: bool = True) -> list[Any]:
    """Cycles one after another under one hold of the cycle lock: the global policy's, then each team's (issue 49;
    `teams` None: the global one and every team, by name). A cycle a crash left running is resumed first, whichever
    policy it trains (then, with `after_resume` false, nothing else). Each team's cycle trains on that team's
    sessions only, and one with too few new sessions is recorded as skipped with the reason. A cycle that fails is
    recorded and logged, and the next one still runs. Returns each cycle's `learning.pipeline.CycleResult` (or the exception it raised), in order.

    Raises:
        CycleLocked: another process holds the lock (a scheduler run is recorded as skipped).
    """
    from app.retrain import RetrainApp
    from learning.pipeline import retrain

    try:
        with cycle_lock(settings.store):
            app = RetrainApp(settings, say)
            try:
                if teams is None:
                    from store.teams import Teams

                    teams = [None, *Teams(app.log).names()]
                results: list[Any] = []
                resumed = app.registry.running_cycle()
                if resumed is not None:  # finish what a crash left, then do what was asked
                    results.append(await retrain(app.parts(), settings.learning.retrain, trigger=trigger,
                                                 force=force, say=say))
                    if not after_resume:
                        return results
                for team in teams:
                    try:
                        results.append(await retrain(app.parts(), settings.learning.retrain, trigger=trigger,
                                                     force=force, say=say, team=team))
                    except Exception as exc:  # noqa: BLE001 - recorded as failed; the other policies still train
                        if len(teams) == 1:
                            raise
                        _log.error("retraining cycle%s failed: %s", f" of team {team}" if team else "", exc)
                        results.append(exc)
                return results
            finally:
                await app.aclose()
    except CycleLocked as exc:
        if trigger == "scheduler":
            from store.registry import Registry
            from store.session_log import SessionLog

            Registry(SessionLog.from_config(settings.store)).record_skip(trigger, str(exc), {})
            telemetry.cycle_finished("skipped")  # recorded as a skip, so counted as one here too
        raise


def sweep(settings: Settings) -> None:
    """The crash sweep (issue 34): sessions whose process is gone become interrupted (resumable) or failed, so none
    stays 'running' for ever, and a cycle never counts one as new work. A store error is logged, never fatal."""
    from app.durable import sweep_leases
    from store.session_log import SessionLog

    try:
        with SessionLog.from_config(settings.store) as log:
            sweep_leases(log, _log.info)
    except Exception:  # noqa: BLE001 - the scheduler goes on; the next tick sweeps again
        _log.exception("crash sweep failed")


def scheduled_job(settings: Settings) -> None:
    """The scheduler's job: one cycle (skipped below min_new_sessions); errors are logged, the scheduler goes on.
    The crash sweep is its own job (`sweep`): a cycle counts only completed sessions, so it need not sweep first."""
    try:
        for result in asyncio.run(run_cycles(settings, trigger="scheduler", force=False, say=_log.info)):
            if not isinstance(result, Exception):
                _log.info("retraining cycle%s: %s", f" of team {result.cycle.team}" if result.cycle.team else "",
                          result.message)
    except CycleLocked as exc:
        _log.info("scheduled cycle skipped: %s", exc)
    except Exception:  # noqa: BLE001 - a failed cycle is recorded in the registry; the next one runs on schedule
        _log.exception("scheduled retraining cycle failed")


def serve_metrics(settings: Settings) -> MetricsServer | None:
    """Start the scheduler's Prometheus endpoint on telemetry.metrics_host:metrics_port (None when the port is 0):
    this process's instruments plus the store's sessions, cycles and live version, read at each scrape.

    Raises:
        MetricsPortInUse: the address is taken (an OSError: the CLI prints it and exits 2), naming the settings.
        HostRuleError: a wildcard bind without RUBRICEM_TELEMETRY__METRICS_ALLOWED_HOSTS (a ValueError: exit 2).
    """
    cfg = settings.telemetry
    if cfg.metrics_port == 0:
        return None
    from app.hostcheck import host_rule
    from app.metrics import metrics_registry, start_metrics_server
    from store.session_log import SessionLog

    rule = host_rule(cfg.metrics_host, cfg.metrics_port, cfg.metrics_allowed_hosts,
                     who="the scheduler's Prometheus endpoint", setting="RUBRICEM_TELEMETRY__METRICS_ALLOWED_HOSTS")
    log = SessionLog.from_config(settings.store)  # held for the process's life: every scrape reads it
    try:
        return start_metrics_server(metrics_registry(log), cfg.metrics_host, cfg.metrics_port, rule)
    except OSError:
        log.close()
        raise


def build_scheduler(settings: Settings, blocking: bool = True) -> Any:
    """An APScheduler scheduler with the retraining job on the configured cron or interval.

    The blocking one is `rubricem scheduler`'s foreground process: it also serves the Prometheus endpoint
    (`serve_metrics`), started here, before any job, so that a port in use stops the command with the settings to
    change; it stops when the scheduler shuts down.
    """
    from apscheduler.events import EVENT_SCHEDULER_SHUTDOWN
    from apscheduler.schedulers.background import BackgroundScheduler
    from apscheduler.schedulers.blocking import BlockingScheduler
    from apscheduler.triggers.cron import CronTrigger
    from apscheduler.triggers.interval import IntervalTrigger

    cfg = settings.learning.retrain
    trigger = (IntervalTrigger(minutes=cfg.interval_minutes) if cfg.interval_minutes > 0
               else CronTrigger.from_crontab(cfg.cron, timezone="UTC"))
    sched = BlockingScheduler(timezone="UTC") if blocking else BackgroundScheduler(timezone="UTC")
    # max_instances=1 + coalesce: a slow cycle never overlaps the next tick in this process; the cycle lock
    # covers other processes (and other hosts with a PostgreSQL store).
    sched.add_job(scheduled_job, trigger, args=[settings], id="retrain", max_instances=1, coalesce=True,
                  misfire_grace_time=3600)
    # The crash sweep (issue 34) when the scheduler starts, then every few minutes, whatever the cycle's cadence.
    every = max(60.0, settings.sessions.lease_s)
    sched.add_job(sweep, IntervalTrigger(seconds=every), args=[settings], id="sweep", max_instances=1, coalesce=True,
                  next_run_time=datetime.now(UTC))
    server = serve_metrics(settings) if blocking else None
    if server is not None:
        sched.add_listener(lambda _event: server.close(), EVENT_SCHEDULER_SHUTDOWN)
    return sched
