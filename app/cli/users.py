"""`rubricem users add|list|remove|set-consent|delete-data` (people, their consent, deleting their data) and the
per-user counts of `rubricem sessions list --user`.

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
    """Run one `rubricem users` action; unknown users and taken names are bad input (exit 2)."""
    from store.users import UserError, Users

    settings = Settings()
    log = SessionLog.from_config(settings.store)
    users = Users(log)
    try:
        if args.action == "add":
            kind = "oidc" if args.oidc else "password"
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
                      f"  sessions: {counts.get(u.user_id, (0, 0))[0]}")
        elif args.action == "remove":
            users.remove(args.user)
            print(f"removed the account {args.user} (their sessions stay: `rubricem users delete-data` removes them)")
        elif args.action == "set-consent":
            record = users.set_consent(args.user, _CONSENT[args.consent])
            print(f"{record.user_id}: learn from their sessions: {_consent_text(record.consent, log.consent_default)}")
        else:
            return _delete_data(settings, log, args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


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
    acts.add_parser("list", help="everyone, with role, consent and session count")
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
    usr.set_defaults(func=cmd_users)
