"""`rubricem users add|list|remove|set-password|set-consent|delete-data` (people, their passwords and consent,
deleting their data), `rubricem users team ...` (teams, issue 49: which policy learns from whose sessions) and the
per-user counts of `rubricem sessions list --user`.

Passwords are read from the terminal (or one line of stdin with --password-stdin), never from argv, where other
users of the machine could read them in the process list. With no terminal and no --password-stdin (as under
`docker compose exec -T`) the command says so and exits 2, before anything is written.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from typing import TYPE_CHECKING

from app.settings import Settings
from store.session_log import SessionLog

if TYPE_CHECKING:
    from store.users import Users

_CONSENT = {"yes": True, "no": False, "default": None}


def _consent_text(value: bool | None, default: bool) -> str:
    return f"default ({'yes' if default else 'no'})" if value is None else ("yes" if value else "no")


def _password(args: argparse.Namespace) -> str:
    """The new password: one line of stdin with --password-stdin, else typed twice on the terminal.

    Raises:
        ValueError: nothing on stdin, no terminal to ask on, or the two entries differ (exit 2, nothing written).
    """
    hint = f"e.g. printf '%s\\n' \"$PASSWORD\" | rubricem users {args.action} {args.user} --password-stdin"
    if args.password_stdin:
        line = sys.stdin.readline()
        if not line:
            raise ValueError(f"nothing on stdin: --password-stdin reads the password from one line of standard input "
                             f"({hint})")
        return line.rstrip("\r\n")
    no_terminal = ValueError("no terminal to ask for the password on (as under `docker compose exec -T`): pass it "
                             f"on one line of stdin with --password-stdin ({hint})")
    if not _has_terminal():  # getpass would read stdin instead, echoing, and fail at its end with an EOFError
        raise no_terminal
    try:
        first = getpass.getpass("password: ")
        again = getpass.getpass("again: ")
    except EOFError:  # the terminal went away (or ^D)
        raise no_terminal from None
    if again != first:
        raise ValueError("the two passwords differ")
    return first


def _has_terminal() -> bool:
    """Whether getpass can ask on a terminal: this process has a controlling terminal (/dev/tty opens) or its stdin
    is one. Off POSIX, getpass asks the console, so there is always one."""
    if os.name != "posix" or sys.stdin.isatty():
        return True
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return False
    os.close(fd)
    return True


def user_counts(log: SessionLog) -> dict[str, tuple[int, int]]:
    """{owner: (sessions, completed sessions)} over every session in the log."""
    with log.transaction(write=False) as conn:
        rows = conn.execute("SELECT owner, COUNT(*), SUM(CASE WHEN status = 'completed' THEN 1 ELSE 0 END) "
                            "FROM sessions GROUP BY owner ORDER BY owner").fetchall()
    return {str(r[0]): (int(r[1]), int(r[2] or 0)) for r in rows}


def print_user_counts(log: SessionLog) -> None:
    """`rubricem sessions list --user` without a name: sessions per person, with their consent."""
    from store.users import Users

    users = Users(log)
    counts = user_counts(log)
    known = {u.user_id: u for u in users.list()}
    for uid in sorted(set(counts) | set(known)):
        total, done = counts.get(uid, (0, 0))
        consent = known[uid].consent if uid in known else None
        print(f"{uid:<40} {total:>6} session(s), {done:>6} completed  learn: "
              f"{_consent_text(consent, log.consent_default)}")


def cmd_users(args: argparse.Namespace) -> int:
    """Run one `rubricem users` action; unknown users or teams, taken names and a refused team removal are bad
    input (exit 2)."""
    from store.teams import TeamError
    from store.users import UserError, UserKind, Users

    settings = Settings()
    log = SessionLog.from_config(settings.store)
    users = Users(log)
    try:
        if args.action == "add":
            kind: UserKind = "oidc" if args.oidc else "password"
            if kind == "oidc" and not args.user.startswith("oidc:"):
                raise ValueError(f"{args.user!r} is not an OIDC id: OIDC people are known by their provider's issuer "
                                 "and subject (oidc:<issuer hash>:<subject>, shown in `rubricem users list` after "
                                 "their first login), never by e-mail; make an address an admin with "
                                 "RUBRICEM_UI__ADMIN_EMAILS (it counts when the provider has verified it)")
            if kind == "password":
                users.check_new_name(args.user)  # a taken or retired name is refused before a password is typed
            record = users.add(args.user, kind=kind, role="admin" if args.admin else "user",
                               password=_password(args) if kind == "password" else None,
                               consent=_CONSENT[args.consent])
            print(f"added {record.user_id} ({record.kind}, {record.role})")
        elif args.action == "set-password":
            _set_password(users, args)
        elif args.action == "list":
            counts = user_counts(log)
            for u in users.list():
                print(f"{u.user_id:<40} {u.kind:<8} {u.role:<5}  learn: {_consent_text(u.consent, log.consent_default)}"
                      f"  sessions: {counts.get(u.user_id, (0, 0))[0]}  team: {u.team or '-'}")
        elif args.action == "remove":
            users.remove(args.user)
            print(f"removed the account {args.user} and ended its browser logins (their sessions stay: `rubricem users "
                  "delete-data` removes them; a name that owned data is never given to a new account)")
        elif args.action == "set-consent":
            record = users.set_consent(args.user, _CONSENT[args.consent])
            print(f"{record.user_id}: learn from their sessions: {_consent_text(record.consent, log.consent_default)}")
        elif args.action == "team":
            _team(log, args)
        else:
            return _delete_data(settings, log, args)
    except (UserError, TeamError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _set_password(users: Users, args: argparse.Namespace) -> None:
    """`rubricem users set-password NAME`: a new password for an account that stays, with every browser signed in
    to it signed out (its login key changes). The account is checked before a password is typed.

    Raises:
        UserError: no such account, or an OIDC or local identity (exit 2, nothing changed).
    """
    from store.users import UserError

    record = users.get(args.user)
    if record.kind != "password":
        raise UserError(f"{record.user_id!r} is not a password account (it is an {record.kind} identity): it has no "
                        "password to set")
    users.set_password(record.user_id, _password(args))
    print(f"set a new password for {record.user_id}; every browser signed in to the account is signed out at its "
          "next page load")


def _on_off(value: bool) -> str:
    return "on" if value else "off"


# What a team's sharing (`teams.share_global`) does, as the store applies it: the global cycle's window and the bank's
# `SessionOwners.unshared_with` both take a team's session only if the team shared when it was asked and still shares.
SHARING_ON = ("the sessions its people ask from now on also train the global policy, and the reflections written "
              "from them also guide the research of people outside the team (as strategy text, never their "
              "questions); sessions asked before stay the team's own")
SHARING_OFF = ("at once, none of its sessions trains the global policy any more, and the reflections written from "
               "them guide only the team's own members")


def team_rows(log: SessionLog) -> list[tuple[str, tuple[str, ...], bool, str]]:
    """(name, members, share_global, what serves it) for every team: its own live version, or `global (<the global
    live version>)` while it has none, so the operator sees which adapter each team's people get right now."""
    from store.registry import Registry
    from store.teams import Teams

    teams = Teams(log).list()
    if not teams:
        return []
    global_live = Registry(log).live().name
    return [(t.name, t.members, t.share_global, t.live_version or f"global ({global_live})") for t in teams]


def _team(log: SessionLog, args: argparse.Namespace) -> None:
    """One `rubricem users team` action. The CLI is the operator (`local`, an admin), as for every `users` command.

    Raises:
        TeamError / UserError: an unknown team or person, a taken name, a team with sessions running (exit 2,
            nothing changed); InvalidInput: a bad team name (the entry point's exit 2, nothing written).
    """
    from store.teams import Teams

    teams = Teams(log)
    act = args.team_action
    if act == "add":
        record = teams.add(args.name, share_global=args.share)
        print(f"added team {record.name} (share with the global policy: {_on_off(record.share_global)}; served the "
              "global policy until a version of its own is promoted)")
    elif act == "list":
        rows = team_rows(log)
        if not rows:
            print("no teams: everyone is served the global policy")
        for name, members, share, live in rows:
            print(f"{name:<24} members: {len(members)} ({', '.join(members) or '-'})  share: {_on_off(share)}  "
                  f"live: {live}")
    elif act == "remove":
        members = teams.get(args.name).members
        teams.remove(args.name)
        print(f"removed team {args.name}; its {len(members)} member(s) are back on the global policy (its versions "
              "stay in the registry and its past sessions keep its name)")
    elif act == "assign":
        teams.assign(args.user, args.team)
        print(f"{args.user} is in team {args.team}: their next sessions use its policy (past sessions keep the team "
              "they started in)")
    elif act == "unassign":
        was = teams.team_of(args.user)
        teams.unassign(args.user)
        print(f"{args.user} is in no team (was: {was or 'none'}): their next sessions use the global policy")
    else:
        record = teams.set_share(args.name, args.state == "on")
        print(f"team {record.name}: sharing {_on_off(record.share_global)}: "
              + (SHARING_ON if record.share_global else SHARING_OFF))


def _delete_data(settings: Settings, log: SessionLog, args: argparse.Namespace) -> int:
    from app.container import open_bank
    from app.durable import purge_checkpoints
    from app.retrain import deletion_copies
    from store.deletion import delete_user_data, owned_sessions, purge_copies, resume_deletions
    from store.rubric_bank import BankError

    if not args.yes:
        raise ValueError(f"delete-data removes every session, thread and feedback row of {args.user} and the bank "
                         "items reflected from them, for good: add --yes")
    try:
        bank = open_bank(settings)
        resume_deletions(log, bank)  # finish an earlier deletion whose bank part was interrupted
    except BankError as exc:
        print(f"warning: the rubric bank is unavailable ({exc}); its part stays pending", file=sys.stderr)
        bank = None
    purge_copies(log, deletion_copies(settings, bank))  # and an earlier one's run folders, once their cycle ended
    # Their sessions' checkpoints first (text outside this database); a failure here deletes nothing.
    purge_checkpoints(settings.store, owned_sessions(log, args.user))
    try:
        result = delete_user_data(log, args.user, requested_by="local", bank=bank, keep_account=args.keep_account,
                                  copies=deletion_copies(settings, bank))
    except BankError as exc:  # the database part is committed; the bank part is retried next time
        print(f"error: the rows are deleted but the rubric bank failed ({exc}); run the command again to finish "
              "removing the bank items", file=sys.stderr)
        return 1
    rows = ", ".join(f"{n} {table}" for table, n in sorted(result.counts.items()) if n)
    print(f"{result.deletion_id}: deleted {rows or 'nothing but the account'}; "
          f"{result.bank_items_removed} rubric-bank item(s) removed")
    if result.marked_versions:
        print("trained on some of this data (it cannot be removed from an adapter): "
              + ", ".join(result.marked_versions))
    copies = result.copies
    if copies is not None and copies.running:
        print(f"a retraining cycle is running ({', '.join(copies.running)}): the version it produces is marked as "
              "trained on this data, and its run folder is removed when it ends")
    if result.bank_pending:
        print("the rubric-bank part is pending: run the command again when the bank is reachable", file=sys.stderr)
        return 1
    if copies is not None and not copies.done:
        print("error: the rows are deleted but some copies could not be removed (" + "; ".join(copies.failed)
              + "); run the command again to finish", file=sys.stderr)
        return 1
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register `rubricem users`."""
    usr = sub.add_parser("users", help="people: accounts, consent to learn from their sessions, deleting their data")
    acts = usr.add_subparsers(dest="action", required=True)
    add = acts.add_parser("add", help="a password account (a name of letters, digits and ._+-; the password is "
                          "asked for) or, with --oidc, an OIDC identity by its oidc:... id")
    add.add_argument("user")
    add.add_argument("--admin", action="store_true", help="may see everyone's sessions and retrain")
    add.add_argument("--oidc", action="store_true", help="an OIDC identity (no password; logs in through the "
                     "identity provider)")
    add.add_argument("--consent", choices=list(_CONSENT), default="default",
                     help="learn from their sessions: yes, no, or the deployment default")
    add.add_argument("--password-stdin", action="store_true", help="read the password from one line of stdin")
    acts.add_parser("list", help="everyone, with role, consent, session count and team")
    rem = acts.add_parser("remove", help="remove an account (their data stays until delete-data; a name that owned "
                          "data is never given to a new account: reset a password with set-password instead)")
    rem.add_argument("user")
    pwd = acts.add_parser("set-password", help="give a password account a new password (asked for, as by add) and "
                          "sign out every browser signed in to it; the account and its data stay")
    pwd.add_argument("user")
    pwd.add_argument("--password-stdin", action="store_true", help="read the password from one line of stdin")
    con = acts.add_parser("set-consent", help="whether their sessions may be judged, trained on and reflected")
    con.add_argument("user")
    con.add_argument("consent", choices=list(_CONSENT))
    dele = acts.add_parser("delete-data", help="delete their sessions, turns, threads, feedback, reflections and "
                           "bank items; marks the policy versions trained on them")
    dele.add_argument("user")
    dele.add_argument("--keep-account", action="store_true", help="keep the login (and consent setting)")
    dele.add_argument("--yes", action="store_true", help="confirm: this cannot be undone")
    _add_team_parsers(acts)
    usr.set_defaults(func=cmd_users)


def _add_team_parsers(acts: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register `rubricem users team ...`: each team's policy learns from its own consenting sessions only."""
    team = acts.add_parser("team", help="teams: each team's policy learns only from its own people's sessions, and "
                           "the reflections written from them guide only its own people, unless the team shares")
    tacts = team.add_subparsers(dest="team_action", required=True)
    add = tacts.add_parser("add", help="a team (a name of a-z, 0-9, - and _); served the global policy until a "
                           "version of its own is promoted")
    add.add_argument("name")
    add.add_argument("--share", action="store_true", help="share from the start: its sessions also train the global "
                     "policy, and the reflections written from them also guide people outside the team")
    tacts.add_parser("list", help="every team, with members, share and the version it is served")
    rem = tacts.add_parser("remove", help="remove a team (refused while one of its sessions runs); its members go "
                           "back to the global policy")
    rem.add_argument("name")
    asg = tacts.add_parser("assign", help="put a person in a team (out of any other); past sessions keep their team")
    asg.add_argument("user")
    asg.add_argument("team")
    una = tacts.add_parser("unassign", help="take a person out of their team (back to the global policy)")
    una.add_argument("user")
    shr = tacts.add_parser("share", help="on: the sessions the team asks from then on also train the global policy, "
                           "and the reflections written from them also guide the research of people outside the team "
                           "(as strategy text, never their questions); off: at once, none of its sessions does either, "
                           "earlier ones included")
    shr.add_argument("name")
    shr.add_argument("state", choices=["on", "off"])
