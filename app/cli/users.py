"""`rubricem users add|list|remove|set-consent|delete-data` (people, their consent, deleting their data), `rubricem
users team ...` (teams, issue 49: which policy learns from whose sessions) and the per-user counts of `rubricem
sessions list --user`.

Passwords are read from the terminal (or one line of stdin with --password-stdin), never from argv, where other
users of the machine could read them in the process list.
"""

from __future__ import annotations

import argparse
import getpass
import sys

from app.settings import Settings
from store.session_log import SessionLog

_CONSENT = {"yes": True, "no": False, "default": None}


def _consent_text(value: bool | None, default: bool) -> str:
    return f"default ({'yes' if default else 'no'})" if value is None else ("yes" if value else "no")


def _password(args: argparse.Namespace) -> str:
    if args.password_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    first = getpass.getpass("password: ")
    if getpass.getpass("again: ") != first:
        raise ValueError("the two passwords differ")
    return first


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
            record = users.add(args.user, kind=kind, role="admin" if args.admin else "user",
                               password=_password(args) if kind == "password" else None,
                               consent=_CONSENT[args.consent])
            print(f"added {record.user_id} ({record.kind}, {record.role})")
        elif args.action == "list":
            counts = user_counts(log)
            for u in users.list():
                print(f"{u.user_id:<40} {u.kind:<8} {u.role:<5}  learn: {_consent_text(u.consent, log.consent_default)}"
                      f"  sessions: {counts.get(u.user_id, (0, 0))[0]}  team: {u.team or '-'}")
        elif args.action == "remove":
            users.remove(args.user)
            print(f"removed the account {args.user} (their sessions stay: `rubricem users delete-data` removes them)")
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


def _on_off(value: bool) -> str:
    return "on" if value else "off"


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
        print(f"team {record.name}: its sessions also train the global policy: {_on_off(record.share_global)}")


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
    rem = acts.add_parser("remove", help="remove an account (their data stays until delete-data)")
    rem.add_argument("user")
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
    team = acts.add_parser("team", help="teams: each team's policy learns only from its own people's sessions")
    tacts = team.add_subparsers(dest="team_action", required=True)
    add = tacts.add_parser("add", help="a team (a name of a-z, 0-9, - and _); served the global policy until a "
                           "version of its own is promoted")
    add.add_argument("name")
    add.add_argument("--share", action="store_true", help="let its sessions also train the global policy")
    tacts.add_parser("list", help="every team, with members, share and the version it is served")
    rem = tacts.add_parser("remove", help="remove a team (refused while one of its sessions runs); its members go "
                           "back to the global policy")
    rem.add_argument("name")
    asg = tacts.add_parser("assign", help="put a person in a team (out of any other); past sessions keep their team")
    asg.add_argument("user")
    asg.add_argument("team")
    una = tacts.add_parser("unassign", help="take a person out of their team (back to the global policy)")
    una.add_argument("user")
    shr = tacts.add_parser("share", help="whether the team's sessions also train the global policy")
    shr.add_argument("name")
    shr.add_argument("state", choices=["on", "off"])
