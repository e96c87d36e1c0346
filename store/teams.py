"""Teams (migration 0013, issue 49): each team's policy learns from its own consenting sessions only.

A person belongs to at most one team (`users.team`); no team means the global policy. A session records its owner's
team when it starts (`sessions.team`, set by `SessionLog.create_session` in the same transaction), and that never
changes: a person moved to another team leaves their past sessions with the team that trained, or will train, on
them. A team's own live version is `teams.live_version` (the registry moves it; `store.registry`); while it is NULL
the team is served the global live version. A team's sessions train the global policy only when the team opts in
(`share_global`, off by default).

Team names become part of version names (`team:<name>@N`), adapter folder names and vLLM adapter names, so they are
short lower-case words: letters, digits, `-` and `_`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from store.errors import InvalidInput, StoreError
from store.session_log import SessionLog
from store.users import UnknownUser, check_user_id

MAX_TEAM_NAME = 40
# A team name as a regex fragment, unanchored: the one rule for names, which `learning.evaluate` also uses to
# recognise the team gate's refusal (a sentence holding a team's name) without restating the rule.
TEAM_NAME_PATTERN = rf"[a-z0-9][a-z0-9_-]{{0,{MAX_TEAM_NAME - 1}}}"
_TEAM_NAME = re.compile(rf"^{TEAM_NAME_PATTERN}$")


class TeamError(StoreError):
    """A team operation is not possible (a name taken, a team with sessions still running)."""


class UnknownTeam(TeamError, LookupError):
    """No such team; the message names the team the caller gave, nothing else."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no team {name!r}")
        self.name = name


@dataclass(frozen=True, slots=True)
class TeamRecord:
    """One team."""

    name: str
    share_global: bool  # its sessions also train the global policy (an explicit opt-in)
    live_version: str | None  # its own live version; None: it is served the global live version
    members: tuple[str, ...]
    created_at: str


def check_team_name(name: object) -> str:
    """A team name as stored: 1..40 characters of a-z, 0-9, '-' and '_', starting with a letter or digit.

    Raises:
        InvalidInput: not a usable name (upper case is refused, not folded, so a name reads the same everywhere).
    """
    if not isinstance(name, str) or not _TEAM_NAME.match(name):
        raise InvalidInput(f"a team name is 1-{MAX_TEAM_NAME} characters of a-z, 0-9, '-' and '_', starting with a "
                           "letter or digit (it becomes part of version and adapter names, e.g. team:law@1)")
    return name


class Teams:
    """The `teams` table and team membership over a SessionLog's database."""

    def __init__(self, log: SessionLog) -> None:
        self.log = log

    def add(self, name: str, *, share_global: bool = False) -> TeamRecord:
        """Create a team (no members, served the global policy until its first promotion).

        Raises:
            InvalidInput: a bad name (nothing written).
            TeamError: the name is taken.
        """
        team = check_team_name(name)
        with self.log.transaction(write=True) as conn:
            if conn.execute("SELECT 1 FROM teams WHERE name = ?", (team,)).fetchone():
                raise TeamError(f"team {team!r} already exists")
            # A removed team's sessions, versions and cycles keep its name: a new team under it would be served its
            # versions and trained on its people's sessions. Names are never reused.
            for table in ("sessions", "policy_versions", "retrain_cycles", "team_alias_history"):  # ours, not input
                if conn.execute(f"SELECT 1 FROM {table} WHERE team = ? LIMIT 1", (team,)).fetchone():
                    raise TeamError(f"the name {team!r} belonged to a removed team whose sessions and versions keep "
                                    "it; pick another name")
            conn.execute("INSERT INTO teams (name, share_global, live_version, created_at) VALUES (?, ?, NULL, ?)",
                         (team, int(bool(share_global)), self.log.now()))
        return self.get(team)

    def get(self, name: str) -> TeamRecord:
        """Raises UnknownTeam (or InvalidInput for a name no team can have)."""
        team = check_team_name(name)
        with self.log.transaction(write=False) as conn:
            row = conn.execute("SELECT name, share_global, live_version, created_at FROM teams WHERE name = ?",
                               (team,)).fetchone()
            if row is None:
                raise UnknownTeam(team)
            members = conn.execute("SELECT user_id FROM users WHERE team = ? ORDER BY user_id", (team,)).fetchall()
        return TeamRecord(str(row[0]), bool(row[1]), row[2], tuple(str(m[0]) for m in members), str(row[3]))

    def list(self) -> list[TeamRecord]:
        """Every team, by name."""
        with self.log.transaction(write=False) as conn:
            names = [str(r[0]) for r in conn.execute("SELECT name FROM teams ORDER BY name").fetchall()]
        return [self.get(n) for n in names]

    def names(self) -> list[str]:
        """Every team's name, sorted."""
        with self.log.transaction(write=False) as conn:
            return [str(r[0]) for r in conn.execute("SELECT name FROM teams ORDER BY name").fetchall()]

    def set_share(self, name: str, share_global: bool) -> TeamRecord:
        """Opt the team's sessions in to (or out of) the global cycle's training data. Raises UnknownTeam."""
        team = check_team_name(name)
        if not isinstance(share_global, bool):
            raise InvalidInput("share_global must be true or false")
        with self.log.transaction(write=True) as conn:
            if conn.execute("UPDATE teams SET share_global = ? WHERE name = ?",
                            (int(share_global), team)).rowcount == 0:
                raise UnknownTeam(team)
        return self.get(team)

    def remove(self, name: str) -> None:
        """Delete a team: its members go back to the global policy. Its versions stay in the registry (deletions
        still mark them) and its past sessions keep its name, which no new team may take (`add`).

        Raises:
            UnknownTeam: no such team.
            TeamError: a session or a retraining cycle of the team is still running (nothing changed).
        """
        team = check_team_name(name)
        with self.log.transaction(write=True) as conn:
            if conn.execute("SELECT 1 FROM teams WHERE name = ?", (team,)).fetchone() is None:
                raise UnknownTeam(team)
            running = int(conn.execute("SELECT COUNT(*) FROM sessions WHERE team = ? AND status = 'running'",
                                       (team,)).fetchone()[0])
            if running:
                raise TeamError(f"team {team!r} has {running} running session(s); remove it when they have ended")
            if conn.execute("SELECT 1 FROM retrain_cycles WHERE team = ? AND status = 'running'", (team,)).fetchone():
                raise TeamError(f"a retraining cycle of team {team!r} is running (or was cut off: `rubricem retrain "
                                f"--now` resumes it); remove the team when it has finished")
            conn.execute("UPDATE users SET team = NULL WHERE team = ?", (team,))
            conn.execute("DELETE FROM teams WHERE name = ?", (team,))

    def assign(self, user_id: str, name: str) -> TeamRecord:
        """Put a person in a team (moving them out of any other: a person belongs to at most one). Their past
        sessions stay with the team they were in when each started.

        Raises:
            UnknownUser, UnknownTeam: nothing changed.
        """
        uid, team = check_user_id(user_id), check_team_name(name)
        with self.log.transaction(write=True) as conn:
            if conn.execute("SELECT 1 FROM teams WHERE name = ?", (team,)).fetchone() is None:
                raise UnknownTeam(team)
            if conn.execute("UPDATE users SET team = ? WHERE user_id = ?", (team, uid)).rowcount == 0:
                raise UnknownUser(uid)
        return self.get(team)

    def unassign(self, user_id: str) -> None:
        """Take a person out of their team (back to the global policy); nothing happens if they are in none.
        Raises UnknownUser."""
        uid = check_user_id(user_id)
        with self.log.transaction(write=True) as conn:
            if conn.execute("UPDATE users SET team = NULL WHERE user_id = ?", (uid,)).rowcount == 0:
                raise UnknownUser(uid)

    def team_of(self, user_id: str) -> str | None:
        """The person's team now; None for no team or a person not known here."""
        try:
            uid = check_user_id(user_id)
        except InvalidInput:
            return None
        with self.log.transaction(write=False) as conn:
            row = conn.execute("SELECT team FROM users WHERE user_id = ?", (uid,)).fetchone()
        return None if row is None or row[0] is None else str(row[0])


__all__ = ["MAX_TEAM_NAME", "TEAM_NAME_PATTERN", "TeamError", "TeamRecord", "Teams", "UnknownTeam", "check_team_name"]
