"""The policy registry: versions `policy@N` (adapter, parent, training run, data window, evaluation report), the
`live` alias with its promotion/rollback history, retraining cycles and the training opt-out, in the session log's
database, SQLite or PostgreSQL (one database, one backup, one transaction scope: `live` flips in one transaction
with its history row).

`base` (number 0, no adapter) is registered and live on first use. A version's adapter must be a complete folder
before it is registered (adapters are written atomically), so the live alias can never point at a half-written one.

Teams (issue 49, `store.teams`): a team's versions are `team:<name>@K` and its own alias is `teams.live_version`
(history in `team_alias_history`). A team without a version of its own is served the global `live`. Promoting or
rolling back a team's version moves that team's alias only; its cycles have their own data window, over its own
sessions.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from store.db import Connection
from store.errors import InvalidInput, StoreError
from store.records import UNLEARNED_SOURCES
from store.session_log import SessionLog

BASE = "base"
LIVE = "live"
VersionStatus = Literal["candidate", "promoted", "rejected"]
CycleStatus = Literal["running", "promoted", "rejected", "skipped", "failed"]


class RegistryError(StoreError):
    """A registry operation is not possible (unknown version, nothing to roll back to, ...)."""


@dataclass(frozen=True, slots=True)
class PolicyVersion:
    """One registered policy version."""

    name: str
    number: int
    adapter_path: str | None
    parent: str | None
    training_run: str
    data_window: Mapping[str, Any]
    eval_report: Mapping[str, Any] | None
    status: VersionStatus
    reason: str | None
    created_at: str
    team: str | None = None  # migration 0013: the team it was trained for; None for the global policy


@dataclass(frozen=True, slots=True)
class AliasChange:
    """One move of an alias."""

    alias: str
    version: str
    previous: str | None
    action: str
    reason: str
    created_at: str


@dataclass(frozen=True, slots=True)
class Cycle:
    """One retraining cycle (also what the scheduler records per run)."""

    cycle_id: str
    trigger: str
    status: CycleStatus
    stage: str
    window_start: str | None
    window_end: str
    candidate: str | None
    numbers: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None
    started_at: str = ""
    finished_at: str | None = None
    team: str | None = None  # the team whose sessions it trains on; None for the global cycle


_VERSION_COLS = ("name, number, adapter_path, parent, training_run, data_window_json, eval_report_json, status, "
                 "reason, created_at, team")
_CYCLE_COLS = ("cycle_id, trigger, status, stage, window_start, window_end, candidate, numbers_json, error, "
               "started_at, finished_at, team")


def team_alias(team: str) -> str:
    """How a team's alias is named in its history: `team:<name>`."""
    return f"team:{team}"


def team_version_prefix(team: str) -> str:
    """What every version name of a team's policy starts with: `team:<name>@`."""
    return f"team:{team}@"


def team_version_name(team: str, k: int) -> str:
    """The K-th version of a team's policy: `team:<name>@K`."""
    return f"{team_version_prefix(team)}{k}"


def _team_scope(team: str | None) -> tuple[str, tuple[Any, ...]]:
    """A WHERE fragment on a table's own `team` column: that team's rows, or the global policy's (NULL)."""
    return ("team IS NULL", ()) if team is None else ("team = ?", (team,))


def _policy_sessions(team: str | None) -> tuple[str, tuple[Any, ...]]:
    """A WHERE fragment on sessions `s`: what trains this policy. A team trains on its own sessions only; the global
    policy on sessions of no team and on a team's sessions asked while the team shared them (`sessions.share_global`,
    read as each session started: opting in later never hands over what was asked before) and only while it still
    does (opting out, or removing the team, takes effect at once, as a person's consent does). A session keeps the
    team it started in (`sessions.team`), never its owner's team of today, so moving a person never moves their
    past sessions."""
    if team is not None:
        return "s.team = ?", (team,)
    return ("(s.team IS NULL OR (s.share_global = 1 AND s.team IN (SELECT t.name FROM teams t "
            "WHERE t.share_global = 1)))"), ()


def _version(r: tuple[Any, ...]) -> PolicyVersion:
    return PolicyVersion(r[0], int(r[1]), r[2], r[3], r[4], json.loads(r[5]), json.loads(r[6]) if r[6] else None,
                         r[7], r[8], r[9], r[10])


def _cycle(r: tuple[Any, ...]) -> Cycle:
    return Cycle(r[0], r[1], r[2], r[3], r[4], r[5], r[6], json.loads(r[7]), r[8], r[9], r[10], r[11])


class Registry:
    """Versions, the live alias and retraining cycles over a SessionLog's database."""

    def __init__(self, log: SessionLog) -> None:
        """Use the log's database (its migrations create the tables); registers and lives `base` on first use."""
        self.log = log
        with log.transaction(write=True) as conn:
            if conn.execute("SELECT 1 FROM policy_versions WHERE name = ?", (BASE,)).fetchone() is None:
                now = log.now()
                conn.execute(f"INSERT INTO policy_versions ({_VERSION_COLS}) VALUES (?, 0, NULL, NULL, '', '{{}}', "
                             "NULL, 'promoted', 'the base model', ?, NULL)", (BASE, now))
                conn.execute("INSERT INTO policy_aliases (alias, version, updated_at) VALUES (?, ?, ?)",
                             (LIVE, BASE, now))
                conn.execute("INSERT INTO alias_history (alias, version, previous, action, reason, created_at) "
                             "VALUES (?, ?, NULL, 'init', 'the base model', ?)", (LIVE, BASE, now))

    # ---- versions ----------------------------------------------------------------------------------------------

    def register(self, adapter_path: Path, *, parent: str, training_run: str = "",
                 data_window: Mapping[str, Any] | None = None, team: str | None = None) -> PolicyVersion:
        """Register a candidate adapter as the next `policy@N`, or for a team as `team:<team>@K` (K counts that
        team's versions; `number` stays one sequence over all versions, so it orders them).

        Raises:
            InvalidInput: the adapter folder is incomplete (no adapter_config.json), the parent or team is unknown.
        """
        path = Path(adapter_path)
        if not (path / "adapter_config.json").is_file():
            raise InvalidInput(f"{path} is not a complete adapter folder (adapter_config.json missing)")
        with self.log.transaction(write=True) as conn:
            if conn.execute("SELECT 1 FROM policy_versions WHERE name = ?", (parent,)).fetchone() is None:
                raise InvalidInput(f"unknown parent version {parent!r}")
            if team is not None and conn.execute("SELECT 1 FROM teams WHERE name = ?", (team,)).fetchone() is None:
                raise InvalidInput(f"unknown team {team!r}")
            number = int(conn.execute("SELECT COALESCE(MAX(number), 0) + 1 FROM policy_versions").fetchone()[0])
            if team is None:
                name = f"policy@{number}"
            else:
                count = int(conn.execute("SELECT COUNT(*) FROM policy_versions WHERE team = ?", (team,)).fetchone()[0])
                name = team_version_name(team, count + 1)
            conn.execute(f"INSERT INTO policy_versions ({_VERSION_COLS}) VALUES (?, ?, ?, ?, ?, ?, NULL, "
                         "'candidate', NULL, ?, ?)", (name, number, str(path.resolve()), parent, training_run,
                                                      json.dumps(dict(data_window or {})), self.log.now(), team))
            # In the same transaction as the version (issue 34): a deletion recorded against its cycle while it
            # trained, and every deletion its parent carries, mark it too (what the parent learned, it starts from).
            conn.execute("INSERT INTO version_data_deletions (version, deletion_id) SELECT CAST(? AS TEXT), "
                         "deletion_id FROM cycle_data_deletions WHERE cycle_id = ? UNION SELECT CAST(? AS TEXT), "
                         "deletion_id FROM version_data_deletions WHERE version = ?",
                         (name, training_run, name, parent))
        return self.get(name)

    def get(self, name: str) -> PolicyVersion:
        """A version by name (RegistryError if unknown)."""
        with self.log.transaction(write=False) as conn:
            row = conn.execute(f"SELECT {_VERSION_COLS} FROM policy_versions WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise RegistryError(f"unknown policy version {name!r}")
        return _version(row)

    def versions(self) -> list[PolicyVersion]:
        """Every version, newest first."""
        with self.log.transaction(write=False) as conn:
            rows = conn.execute(f"SELECT {_VERSION_COLS} FROM policy_versions ORDER BY number DESC").fetchall()
        return [_version(r) for r in rows]

    def live(self, team: str | None = None) -> PolicyVersion:
        """The version the `live` alias points at; for a team, its own live version, else the global one."""
        own = self.team_live(team) if team is not None else None
        if own is not None:
            return own
        with self.log.transaction(write=False) as conn:
            name = conn.execute("SELECT version FROM policy_aliases WHERE alias = ?", (LIVE,)).fetchone()[0]
        return self.get(str(name))

    def team_live(self, team: str) -> PolicyVersion | None:
        """The team's own live version; None while it has none (its people are served the global one).

        Raises:
            RegistryError: no such team.
        """
        with self.log.transaction(write=False) as conn:
            row = conn.execute("SELECT live_version FROM teams WHERE name = ?", (team,)).fetchone()
        if row is None:
            raise RegistryError(f"unknown team {team!r}")
        return None if row[0] is None else self.get(str(row[0]))

    def current(self, team: str | None = None) -> tuple[str, str | None]:
        """(live version name, its adapter folder or None): what a serving process should answer with."""
        live = self.live(team)
        return live.name, live.adapter_path

    def set_eval_report(self, name: str, report: Mapping[str, Any]) -> None:
        """Attach an evaluation report to a version."""
        self._update_version(name, eval_report_json=json.dumps(dict(report)))

    def reject(self, name: str, reason: str, report: Mapping[str, Any] | None = None) -> None:
        """Mark a candidate rejected with its reason (it never becomes live)."""
        version = self.get(name)
        if version.status != "candidate":
            raise RegistryError(f"{name} is {version.status}; only a candidate can be rejected")
        updates: dict[str, Any] = {"status": "rejected", "reason": reason}
        if report is not None:
            updates["eval_report_json"] = json.dumps(dict(report))
        self._update_version(name, **updates)

    def _update_version(self, name: str, **cols: Any) -> None:
        sets = ", ".join(f"{c} = ?" for c in cols)
        with self.log.transaction(write=True) as conn:
            cur = conn.execute(f"UPDATE policy_versions SET {sets} WHERE name = ?", (*cols.values(), name))
            if cur.rowcount == 0:
                raise RegistryError(f"unknown policy version {name!r}")

    # ---- the live alias ------------------------------------------------------------------------------------------

    def promote(self, name: str, reason: str = "") -> AliasChange:
        """Point `live` at `name` (a candidate or an earlier promoted version); one transaction with its history.
        A team's version moves that team's alias only (`teams.live_version`), never the global one."""
        version = self.get(name)
        if version.status == "rejected":
            raise RegistryError(f"{name} was rejected ({version.reason}); it cannot go live")
        if version.adapter_path is not None and not (Path(version.adapter_path) / "adapter_config.json").is_file():
            raise RegistryError(f"{name}'s adapter folder {version.adapter_path} is gone; it cannot go live")
        with self.log.transaction(write=True) as conn:
            if version.team is not None:
                return self._move_team(conn, version.team, name, "promote", reason or "promoted")
            return self._move(conn, name, "promote", reason or "promoted")

    def rollback(self, reason: str = "rollback", team: str | None = None) -> AliasChange:
        """Point `live` back at the version that was live before the current one; for a team, its alias only (back
        to the global policy after its first version).

        Raises:
            RegistryError: nothing to roll back to.
        """
        if team is not None:
            with self.log.transaction(write=True) as conn:
                current, target = self._team_rollback(conn, team)
                if current is None:
                    raise RegistryError(f"team {team!r} is served the global policy; there is nothing to roll back")
                return self._move_team(conn, team, target, "rollback", reason)
        with self.log.transaction(write=True) as conn:
            current = conn.execute("SELECT version FROM policy_aliases WHERE alias = ?", (LIVE,)).fetchone()[0]
            # The promotion that made the current version live names what was live before it; rollbacks are skipped,
            # so repeated rollbacks walk back down the chain instead of bouncing between two versions.
            rows = conn.execute("SELECT version, previous FROM alias_history WHERE alias = ? AND action != 'rollback' "
                                "ORDER BY id DESC", (LIVE,)).fetchall()
            target = next((r[1] for r in rows if r[0] == current and r[1] is not None), None)
            if target is None:
                raise RegistryError(f"live is {current} and there is no earlier live version to roll back to")
            return self._move(conn, str(target), "rollback", reason)

    def _move(self, conn: Connection, name: str, action: str, reason: str) -> AliasChange:
        now = self.log.now()
        previous = conn.execute("SELECT version FROM policy_aliases WHERE alias = ?", (LIVE,)).fetchone()[0]
        conn.execute("UPDATE policy_aliases SET version = ?, updated_at = ? WHERE alias = ?", (name, now, LIVE))
        conn.execute("UPDATE policy_versions SET status = 'promoted', reason = COALESCE(reason, ?) WHERE name = ? "
                     "AND status = 'candidate'", (reason, name))
        conn.execute("INSERT INTO alias_history (alias, version, previous, action, reason, created_at) "
                     "VALUES (?, ?, ?, ?, ?, ?)", (LIVE, name, previous, action, reason, now))
        return AliasChange(LIVE, name, previous, action, reason, now)

    def rollback_target(self, team: str | None = None) -> PolicyVersion | None:
        """The version `rollback` would make live, found without moving anything (so it can be loaded everywhere
        first); None for a team whose rollback returns it to the global policy.

        Raises:
            RegistryError: nothing to roll back to.
        """
        if team is None:
            current = self.live().name
            for change in self.history(limit=1_000_000_000):
                if change.action != "rollback" and change.version == current and change.previous:
                    return self.get(change.previous)
            raise RegistryError(f"live is {current} and there is no earlier live version to roll back to")
        with self.log.transaction(write=False) as conn:
            current, target = self._team_rollback(conn, team)
        if current is None:
            raise RegistryError(f"team {team!r} is served the global policy; there is nothing to roll back")
        return None if target is None else self.get(target)

    def _team_rollback(self, conn: Connection, team: str) -> tuple[str | None, str | None]:
        """(the team's live version, the one its promotion replaced; None = the global policy). The promotion that
        made the current version live names what was live before it; rollbacks are skipped, so repeated rollbacks
        walk back down the chain, as for the global alias."""
        row = conn.execute("SELECT live_version FROM teams WHERE name = ?", (team,)).fetchone()
        if row is None:
            raise RegistryError(f"unknown team {team!r}")
        current = row[0]
        if current is None:
            return None, None
        rows = conn.execute("SELECT version, previous FROM team_alias_history WHERE team = ? AND action != 'rollback' "
                            "ORDER BY id DESC", (team,)).fetchall()
        target = next((r[1] for r in rows if r[0] == current), None)
        return str(current), None if target is None else str(target)

    def _move_team(self, conn: Connection, team: str, name: str | None, action: str, reason: str) -> AliasChange:
        """Move a team's alias to `name` (None: back to the global policy) with its history row."""
        row = conn.execute("SELECT live_version FROM teams WHERE name = ?", (team,)).fetchone()
        if row is None:
            raise RegistryError(f"unknown team {team!r}: its versions cannot go live")
        now = self.log.now()
        conn.execute("UPDATE teams SET live_version = ? WHERE name = ?", (name, team))
        if name is not None:
            conn.execute("UPDATE policy_versions SET status = 'promoted', reason = COALESCE(reason, ?) WHERE name = ? "
                         "AND status = 'candidate'", (reason, name))
        conn.execute("INSERT INTO team_alias_history (team, version, previous, action, reason, created_at) "
                     "VALUES (?, ?, ?, ?, ?, ?)", (team, name, row[0], action, reason, now))
        return AliasChange(team_alias(team), name or LIVE, row[0], action, reason, now)

    def history(self, limit: int = 50, team: str | None = None) -> list[AliasChange]:
        """Alias moves, newest first; a team's own (a version of "live" there means the global policy)."""
        if team is not None:
            with self.log.transaction(write=False) as conn:
                rows = conn.execute("SELECT version, previous, action, reason, created_at FROM team_alias_history "
                                    "WHERE team = ? ORDER BY id DESC LIMIT ?", (team, limit)).fetchall()
            return [AliasChange(team_alias(team), r[0] or LIVE, r[1], r[2], r[3], r[4]) for r in rows]
        with self.log.transaction(write=False) as conn:
            rows = conn.execute("SELECT alias, version, previous, action, reason, created_at FROM alias_history "
                                "ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        return [AliasChange(*r) for r in rows]

    # ---- retraining cycles ---------------------------------------------------------------------------------------

    def start_cycle(self, trigger: str, window_end: str, team: str | None = None) -> Cycle:
        """Open a cycle over sessions finished after the last finished cycle's window (of the same team, or of the
        global policy) and at or before `window_end`. One cycle runs at a time, whichever policy it trains."""
        scope, args = _team_scope(team)
        with self.log.transaction(write=True) as conn:
            if conn.execute("SELECT 1 FROM retrain_cycles WHERE status = 'running'").fetchone():
                raise RegistryError("a retraining cycle is already running; resume or fail it first")
            if team is not None and conn.execute("SELECT 1 FROM teams WHERE name = ?", (team,)).fetchone() is None:
                raise RegistryError(f"unknown team {team!r}")
            prev = conn.execute("SELECT MAX(window_end) FROM retrain_cycles WHERE status IN ('promoted', "
                                f"'rejected') AND {scope}", args).fetchone()[0]
            cycle_id = f"cycle-{uuid.uuid4().hex[:12]}"
            conn.execute(f"INSERT INTO retrain_cycles ({_CYCLE_COLS}) VALUES (?, ?, 'running', 'start', ?, ?, NULL, "
                         "'{}', NULL, ?, NULL, ?)", (cycle_id, trigger, prev, window_end, self.log.now(), team))
        return self.cycle(cycle_id)

    def running_cycle(self) -> Cycle | None:
        """The cycle a crash left running, if any."""
        with self.log.transaction(write=False) as conn:
            row = conn.execute(f"SELECT {_CYCLE_COLS} FROM retrain_cycles WHERE status = 'running'").fetchone()
        return _cycle(row) if row else None

    def cycle(self, cycle_id: str) -> Cycle:
        """A cycle by id."""
        with self.log.transaction(write=False) as conn:
            row = conn.execute(f"SELECT {_CYCLE_COLS} FROM retrain_cycles WHERE cycle_id = ?", (cycle_id,)).fetchone()
        if row is None:
            raise RegistryError(f"unknown cycle {cycle_id!r}")
        return _cycle(row)

    def cycles(self, limit: int = 20) -> list[Cycle]:
        """Cycles, newest first."""
        with self.log.transaction(write=False) as conn:
            rows = conn.execute(f"SELECT {_CYCLE_COLS} FROM retrain_cycles ORDER BY started_at DESC, rowid DESC "
                                "LIMIT ?", (limit,)).fetchall()
        return [_cycle(r) for r in rows]

    def advance_cycle(self, cycle_id: str, stage: str, *, candidate: str | None = None,
                      numbers: Mapping[str, Any] | None = None) -> Cycle:
        """Record that a running cycle reached `stage` (numbers are merged into the cycle's)."""
        current = self.cycle(cycle_id)
        merged = dict(current.numbers) | dict(numbers or {})
        with self.log.transaction(write=True) as conn:
            conn.execute("UPDATE retrain_cycles SET stage = ?, candidate = COALESCE(?, candidate), numbers_json = ? "
                         "WHERE cycle_id = ? AND status = 'running'", (stage, candidate, json.dumps(merged), cycle_id))
        return self.cycle(cycle_id)

    def finish_cycle(self, cycle_id: str, status: CycleStatus, *, error: str | None = None,
                     numbers: Mapping[str, Any] | None = None) -> Cycle:
        """Close a cycle with its outcome."""
        if status == "running":
            raise InvalidInput("a cycle finishes as promoted, rejected, skipped or failed")
        merged = dict(self.cycle(cycle_id).numbers) | dict(numbers or {})
        with self.log.transaction(write=True) as conn:
            conn.execute("UPDATE retrain_cycles SET status = ?, stage = 'done', error = ?, numbers_json = ?, "
                         "finished_at = ? WHERE cycle_id = ?", (status, error, json.dumps(merged), self.log.now(),
                                                                  cycle_id))
        return self.cycle(cycle_id)

    def record_skip(self, trigger: str, reason: str, numbers: Mapping[str, Any], team: str | None = None) -> Cycle:
        """A scheduler run that found too little new data (recorded, nothing trained)."""
        now = self.log.now()
        cycle_id = f"cycle-{uuid.uuid4().hex[:12]}"
        with self.log.transaction(write=True) as conn:
            conn.execute(f"INSERT INTO retrain_cycles ({_CYCLE_COLS}) VALUES (?, ?, 'skipped', 'done', NULL, ?, NULL, "
                         "?, ?, ?, ?, ?)", (cycle_id, trigger, now, json.dumps(dict(numbers)), reason, now, now, team))
        return self.cycle(cycle_id)

    # ---- the data window -----------------------------------------------------------------------------------------

    def sessions_in_window(self, window_start: str | None, window_end: str, team: str | None = None) -> list[str]:
        """Completed sessions finished in (window_start, window_end] that may be learned from (no training opt-out,
        the owner consents), oldest first: a team's own sessions, or for the global policy the sessions of no team
        and of teams that opted in to share (`_policy_sessions`)."""
        learnable, consent = self.log.learnable_sql("s")
        belongs, args = _policy_sessions(team)
        with self.log.transaction(write=False) as conn:
            rows = conn.execute(
                f"SELECT s.session_id FROM sessions s WHERE s.status = 'completed' AND {learnable} AND {belongs} "
                "AND s.finished_at > ? AND s.finished_at <= ? ORDER BY s.finished_at, s.rowid",
                (*consent, *args, window_start or "", window_end)).fetchall()
        return [str(r[0]) for r in rows]

    def skipped_in_window(self, window_start: str | None, window_end: str, team: str | None = None) -> int:
        """Completed user sessions of the policy's people finished in (window_start, window_end] left out because
        their owner does not consent or they were opted out (benchmark runs and gate probes are not counted: they
        are never users')."""
        learnable, consent = self.log.learnable_sql("s")
        belongs, args = _policy_sessions(team)
        unlearned = ", ".join(f"'{s}'" for s in sorted(UNLEARNED_SOURCES))  # our constants, not input
        with self.log.transaction(write=False) as conn:
            row = conn.execute(
                f"SELECT COUNT(*) FROM sessions s WHERE s.status = 'completed' AND NOT ({learnable}) AND {belongs} "
                f"AND s.source NOT IN ({unlearned}) AND s.finished_at > ? AND s.finished_at <= ?",
                (*consent, *args, window_start or "", window_end)).fetchone()
        return int(row[0])

    def set_opt_out(self, session_id: str, opt_out: bool = True) -> None:
        """Keep (or stop keeping) a session out of training."""
        with self.log.transaction(write=True) as conn:
            cur = conn.execute("UPDATE sessions SET training_opt_out = ? WHERE session_id = ?",
                               (int(opt_out), session_id))
            if cur.rowcount == 0:
                raise InvalidInput(f"unknown session {session_id!r}")
