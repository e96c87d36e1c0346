"""People who use the app (migration 0008): named accounts for password logins, OIDC and local identities, their
role and their consent to learn from their sessions. Kind "local" is an identity the deployment itself defines:
`local` (the operator: the CLI, the open loopback UI) and the UI's shared-password ids `shared:user`/`shared:admin`.

Passwords are hashed with bcrypt and never stored, logged or put in an error message; a `UserRecord` carries no hash.
A new password is at least 8 characters, at most bcrypt's 72 bytes, not the account's name and not one of the
commonly used passwords in `common_passwords.txt` (OWASP ASVS 2.1.7); `set_password` changes it in place.

A password account's name is one spelling only (issue 65): lower-case ASCII letters, digits and ._+-, at most 64
characters, so a case variant, a look-alike or an invisible character can never make a second account that reads as
the first. A name that owned data (sessions, chat threads, feedback, or a deletion record) is never given to a new
account: the new person would be taken for the old one. A browser login keeps the account's login key (`login_key`,
a digest of its password hash), so re-making an account or setting its password ends every login made before.
"""

from __future__ import annotations

import functools
import hashlib
import re
import unicodedata
from dataclasses import dataclass
from importlib import resources
from typing import Literal

import bcrypt

from store.db import Connection
from store.errors import InvalidInput, StoreError
from store.owner import LOCAL, MCP
from store.session_log import SessionLog

UserKind = Literal["password", "oidc", "local"]
UserRole = Literal["user", "admin"]
MAX_USER_ID = 254  # an e-mail address at most
MAX_ACCOUNT_NAME = 64  # a password account's name: typed at every login, shown in every owner list
_BCRYPT_MAX_BYTES = 72  # bcrypt 5 refuses longer passwords instead of truncating them silently
_MIN_PASSWORD = 8
# No '@': an address belongs to an OIDC login, and an account named like one could be taken for it. No ':': the
# `shared:` and `oidc:` ids of the UI's other logins live there, so no account can ever be one of them.
_ACCOUNT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
_NAME_RULE = ("a password account needs a name of letters, digits and ._+- other than 'local' and 'mcp' (no '@': "
              "e-mail addresses are OIDC logins, so a password account can never stand in for one; pick a plain name "
              "such as 'alice')")
# Tables whose rows carry an owner (migration 0008): a name found there owned data (`Users.check_new_name`).
_OWNED_TABLES = ("sessions", "chat_threads", "feedback")


class UserError(StoreError):
    """A user operation is not possible (an unknown user, a name already taken)."""


class UnknownUser(UserError, LookupError):
    """No such user; the message names the id the caller gave, nothing else."""

    def __init__(self, user_id: str) -> None:
        super().__init__(f"no user {user_id!r}")
        self.user_id = user_id


@dataclass(frozen=True, slots=True)
class UserRecord:
    """One person, without any password material."""

    user_id: str
    kind: UserKind
    role: UserRole
    consent: bool | None  # None: the deployment default applies
    created_at: str
    team: str | None = None  # migration 0013: their team (store.teams), None for the global policy


def check_user_id(user_id: object) -> str:
    """A user id as stored: stripped, 1..254 characters, no control characters; e-mails are lower-cased.

    Raises:
        InvalidInput: not a usable id.
    """
    if not isinstance(user_id, str) or not user_id.strip():
        raise InvalidInput("a user id must be a non-empty string")
    text = user_id.strip()
    if len(text) > MAX_USER_ID or any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise InvalidInput("a user id must be at most 254 printable characters")
    return text.lower() if "@" in text else text


def check_account_name(name: object) -> str:
    """A new password account's name as stored: 1-64 characters of a-z, 0-9 and ._+-, starting with a letter or
    digit, not `local` or `mcp`.

    Refused, never folded, so a name reads the same at the login form, in every owner list and in the check that a
    name is not reused (as team names are): `Alice`, alice with a zero-width space, or alice in full-width or
    Cyrillic letters can never be a second alice.

    Raises:
        InvalidInput: saying what is wrong (an invisible or look-alike character is named by its code point,
            never echoed).
    """
    if not isinstance(name, str) or not name.strip():
        raise InvalidInput("an account needs a name: " + _NAME_RULE)
    text = name.strip()
    if len(text) > MAX_ACCOUNT_NAME:
        raise InvalidInput(f"an account name is at most {MAX_ACCOUNT_NAME} characters; this one has {len(text)}")
    if not text.isascii():
        raise InvalidInput(_non_ascii_refusal(text))
    if "@" in text or ":" in text or text.lower() in (LOCAL, MCP) or not _ACCOUNT_NAME.fullmatch(text):
        raise InvalidInput(_NAME_RULE)
    if text != text.lower():
        raise InvalidInput(f"account names are lower case, so that 'Alice' and 'alice' can never be two accounts: "
                           f"use {text.lower()!r}")
    return text


def _non_ascii_refusal(text: str) -> str:
    """Why a name with a character outside ASCII is refused: the first such character by code point and name, and
    what the name reads as once folded (NFKC, invisible characters dropped), when that is plain ASCII."""
    pos, char = next((i, c) for i, c in enumerate(text) if not c.isascii())
    what = f"U+{ord(char):04X} {unicodedata.name(char, 'UNNAMED CHARACTER')}"
    folded = "".join(c for c in unicodedata.normalize("NFKC", text) if unicodedata.category(c) not in ("Cf", "Mn"))
    reads = f" (it reads as {folded!r})" if folded.isascii() and folded != text else ""
    return (f"the name has {what} at position {pos + 1}{reads}: account names are plain ASCII letters, digits and "
            "._+-, because look-alike, full-width and invisible characters make two names that read the same")


@functools.cache
def common_passwords() -> frozenset[str]:
    """The commonly used passwords shipped as `store/common_passwords.txt` (package data), lower-cased."""
    text = resources.files("store").joinpath("common_passwords.txt").read_text(encoding="utf-8")
    return frozenset(line.strip().lower() for line in text.splitlines()
                     if line.strip() and not line.lstrip().startswith("#"))


def check_password(password: object, account: str | None = None) -> str:
    """A new password that may be hashed: 8 characters to 72 bytes (UTF-8), not the account's name, not common.

    Long passwords are refused rather than truncated, so two long passwords with the same start never log in as
    each other. The common list is what an attacker guesses first (ASVS 2.1.7); no composition rule is added, as
    ASVS asks. No message repeats the password.

    Raises:
        InvalidInput: naming the rule it breaks.
    """
    if not isinstance(password, str) or len(password) < _MIN_PASSWORD:
        raise InvalidInput(f"a password needs at least {_MIN_PASSWORD} characters")
    raw = password.encode("utf-8")
    if len(raw) > _BCRYPT_MAX_BYTES:
        raise InvalidInput(f"a password may be at most {_BCRYPT_MAX_BYTES} bytes (UTF-8) long; this one is "
                           f"{len(raw)}")
    folded = password.strip().lower()
    if account is not None and folded == account.strip().lower():
        raise InvalidInput("a password may not be the account's name: choose another")
    if folded in common_passwords():
        raise InvalidInput("this password is on the list of commonly used passwords, which are the first ones "
                           "guessed: choose another (a few unrelated words make a strong one)")
    return password


def hash_password(password: str, account: str | None = None) -> str:
    """The bcrypt hash of a password that passes `check_password`.

    Raises:
        InvalidInput: too short, longer than bcrypt's 72 bytes, the account's name, or a common password.
    """
    raw = check_password(password, account).encode("utf-8")
    return bcrypt.hashpw(raw, bcrypt.gensalt()).decode("ascii")


def _login_key(password_hash: str) -> str:
    """The login key of an account whose password hash is `password_hash`: what a browser login keeps to show it
    signed in to this account as it is now. A new hash (the account made again under its name, or a new password)
    gives a new key, so every login made before ends at its next page load. One-way: it tells nothing of the hash."""
    return hashlib.sha256(b"rubricem-login:" + password_hash.encode("ascii")).hexdigest()


_DUMMY: list[bytes] = []


def _dummy_hash() -> bytes:
    if not _DUMMY:
        _DUMMY.append(bcrypt.hashpw(b"no such account", bcrypt.gensalt()))
    return _DUMMY[0]


class Users:
    """The `users` table over a SessionLog's database."""

    def __init__(self, log: SessionLog) -> None:
        self.log = log

    def add(self, user_id: str, *, kind: UserKind = "password", role: UserRole = "user",
            password: str | None = None, consent: bool | None = None) -> UserRecord:
        """Create a person. Password accounts need a password and a new name (`check_new_name`); OIDC and local
        identities must not have a password.

        Raises:
            InvalidInput: a bad id, kind, role or password (nothing written).
            UserError: the id is taken, or it is a password account's name that owned data (nothing written).
        """
        if kind not in ("password", "oidc", "local") or role not in ("user", "admin"):
            raise InvalidInput("kind must be password, oidc or local; role user or admin")
        if kind == "password":
            uid = check_account_name(user_id)
            if password is None:
                raise InvalidInput("a password account needs a password")
        else:
            uid = check_user_id(user_id)
            if password is not None:
                raise InvalidInput(f"a {kind} identity has no password")
        hashed = hash_password(password, uid) if password is not None else None
        with self.log.transaction(write=True) as conn:
            if kind == "password":
                _refuse_taken_name(conn, uid)
            elif conn.execute("SELECT 1 FROM users WHERE user_id = ?", (uid,)).fetchone():
                raise UserError(f"user {uid!r} already exists")
            conn.execute("INSERT INTO users (user_id, kind, role, password_hash, consent, created_at) "
                         "VALUES (?, ?, ?, ?, ?, ?)",
                         (uid, kind, role, hashed, None if consent is None else int(consent), self.log.now()))
        return self.get(uid)

    def check_new_name(self, user_id: str) -> str:
        """The name a new password account would have, checked before anyone types a password for it (`add` checks
        again as it writes).

        Raises:
            InvalidInput: not a usable account name (`check_account_name`).
            UserError: an account has it in any case, or it owned data (`_refuse_taken_name`).
        """
        uid = check_account_name(user_id)
        with self.log.transaction(write=False) as conn:
            _refuse_taken_name(conn, uid)
        return uid

    def set_password(self, user_id: str, password: str) -> UserRecord:
        """Give a password account a new password, keeping the account, its data and its settings: the way to reset
        a password without removing the account. Every browser login made before ends (its login key changes).

        Raises:
            InvalidInput: the password breaks a rule of `check_password` (nothing changed).
            UnknownUser: no such account.
            UserError: the id is an OIDC or local identity, which has no password.
        """
        uid = check_user_id(user_id)
        hashed = hash_password(password, uid)
        with self.log.transaction(write=True) as conn:
            row = conn.execute("SELECT kind FROM users WHERE user_id = ?", (uid,)).fetchone()
            if row is None:
                raise UnknownUser(uid)
            if row[0] != "password":
                raise UserError(f"{uid!r} is not a password account (it is an {row[0]} identity): it has no password "
                                "to set")
            conn.execute("UPDATE users SET password_hash = ? WHERE user_id = ?", (hashed, uid))
        return self.get(uid)

    def ensure(self, user_id: str, *, kind: UserKind, role: UserRole) -> UserRecord:
        """The person with this id, created on first sight (OIDC logins, the shared-password and local identities);
        the role follows the deployment's settings on every login (an e-mail removed from the admin list stops
        being admin).

        Never lands on a password account: only the account's own password logs in as it, whatever id another
        login arrives with (an OIDC subject, a shared-password id).

        Raises:
            InvalidInput: kind "password" (accounts are made by `add`, with their password).
            UserError: the id is a password account (nothing changed).
        """
        uid = check_user_id(user_id)
        if kind not in ("oidc", "local") or role not in ("user", "admin"):
            raise InvalidInput("ensure makes oidc or local identities with role user or admin; password accounts "
                               "come from `rubricem users add`")
        with self.log.transaction(write=True) as conn:
            row = conn.execute("SELECT kind FROM users WHERE user_id = ?", (uid,)).fetchone()
            if row is None:
                conn.execute("INSERT INTO users (user_id, kind, role, password_hash, consent, created_at) "
                             "VALUES (?, ?, ?, NULL, NULL, ?)", (uid, kind, role, self.log.now()))
            elif row[0] == "password":
                raise UserError(f"the id {uid!r} is a password account, so a {kind} login cannot use it; ask an "
                                "administrator to rename or remove that account")
            else:
                conn.execute("UPDATE users SET role = ? WHERE user_id = ?", (role, uid))
        return self.get(uid)

    def get(self, user_id: str) -> UserRecord:
        """Raises UnknownUser."""
        uid = check_user_id(user_id)
        with self.log.transaction(write=False) as conn:
            row = conn.execute("SELECT user_id, kind, role, consent, created_at, team FROM users WHERE user_id = ?",
                               (uid,)).fetchone()
        if row is None:
            raise UnknownUser(uid)
        return UserRecord(row[0], row[1], row[2], None if row[3] is None else bool(row[3]), row[4], row[5])

    def find(self, user_id: str) -> UserRecord | None:
        """The person, or None."""
        try:
            return self.get(user_id)
        except (UnknownUser, InvalidInput):
            return None

    def list(self) -> list[UserRecord]:
        """Everyone, by id."""
        with self.log.transaction(write=False) as conn:
            rows = conn.execute("SELECT user_id, kind, role, consent, created_at, team FROM users "
                                "ORDER BY user_id").fetchall()
        return [UserRecord(r[0], r[1], r[2], None if r[3] is None else bool(r[3]), r[4], r[5]) for r in rows]

    def remove(self, user_id: str) -> None:
        """Delete the account (their sessions stay, until `delete_user_data`): its browser logins end at their next
        page load, and a name that owned data is never given to a new account (`check_new_name`). Raises
        UnknownUser."""
        uid = check_user_id(user_id)
        with self.log.transaction(write=True) as conn:
            if conn.execute("DELETE FROM users WHERE user_id = ?", (uid,)).rowcount == 0:
                raise UnknownUser(uid)

    def set_consent(self, user_id: str, consent: bool | None) -> UserRecord:
        """Whether this person's sessions (past and future) may be learned from; None = the deployment default.
        The local user gets a row on first use. Raises UnknownUser for anyone else not known."""
        uid = check_user_id(user_id)
        if consent is not None and not isinstance(consent, bool):
            raise InvalidInput("consent must be true, false or None (the default)")
        if uid == LOCAL:
            self.ensure(LOCAL, kind="local", role="admin")
        with self.log.transaction(write=True) as conn:
            cur = conn.execute("UPDATE users SET consent = ? WHERE user_id = ?",
                               (None if consent is None else int(consent), uid))
            if cur.rowcount == 0:
                raise UnknownUser(uid)
        return self.get(uid)

    def consents(self, user_id: str) -> bool:
        """The effective choice: the person's own, else the deployment default (unknown people get the default)."""
        found = self.find(user_id)
        return self.log.consent_default if found is None or found.consent is None else found.consent

    def verify_password(self, user_id: str, password: str) -> UserRecord | None:
        """The account when the password is right, else None (unknown name, wrong or over-long password, a
        non-password identity): one answer for every failure, so a login form cannot probe for names."""
        signed = self.sign_in(user_id, password)
        return signed[0] if signed is not None else None

    def sign_in(self, user_id: str, password: str) -> tuple[UserRecord, str] | None:
        """`verify_password` with the account's login key as the password was checked against it: what a browser
        login keeps (`login_key`), so that the account made again or given a new password is not this login's."""
        try:
            uid = check_user_id(user_id)
        except InvalidInput:
            return None
        stored = self._password_hash(uid)
        raw = password.encode("utf-8") if isinstance(password, str) else b""
        if not raw or len(raw) > _BCRYPT_MAX_BYTES:
            return None
        if stored is None:  # spend a hash check anyway, so timing does not tell which names exist
            bcrypt.checkpw(raw, _dummy_hash())
            return None
        try:
            ok = bcrypt.checkpw(raw, stored.encode("ascii"))
        except ValueError:  # a corrupt hash is a failed login, and its text never reaches a message
            return None
        return (self.get(uid), _login_key(stored)) if ok else None

    def login_key(self, user_id: str) -> str | None:
        """The password account's login key now (see `_login_key`); None when there is no such password account."""
        try:
            uid = check_user_id(user_id)
        except InvalidInput:
            return None
        stored = self._password_hash(uid)
        return None if stored is None else _login_key(stored)

    def _password_hash(self, uid: str) -> str | None:
        """The stored bcrypt hash of password account `uid` (already checked), or None when there is none."""
        with self.log.transaction(write=False) as conn:
            row = conn.execute("SELECT password_hash FROM users WHERE user_id = ? AND kind = 'password'",
                               (uid,)).fetchone()
        return None if row is None or row[0] is None else str(row[0])


def _refuse_taken_name(conn: Connection, name: str) -> None:
    """Refuse a new password account's name that an account has in any case, or that owned data: rows still owned
    under it in any case (its account removed with `users remove`), or a deletion record of it (`users
    delete-data`). A new person under such a name would be taken for the old one, and shown what was theirs: the
    name is tombstoned, as a removed team's name is (`store.teams`). Read from the data itself, so accounts removed
    before this check existed are covered; sessions made for RUBRICEM_MCP__OWNER under a name with no account
    count too (make the account first, then point the MCP owner at it, as SECURITY.md says).

    Raises:
        UserError: naming `rubricem users set-password`, the way to reset a password that keeps the account.
    """
    from store.deletion import subject_sha  # store.deletion imports this module

    row = conn.execute("SELECT user_id FROM users WHERE lower(user_id) = ?", (name,)).fetchone()
    if row is not None:
        raise UserError(f"user {str(row[0])!r} already exists (to give it a new password, keep it and run `rubricem "
                        f"users set-password {row[0]}`)")
    owned = any(conn.execute(f"SELECT 1 FROM {table} WHERE lower(owner) = ? LIMIT 1", (name,)).fetchone()
                for table in _OWNED_TABLES)  # table names are ours, not input
    if owned or conn.execute("SELECT 1 FROM data_deletions WHERE subject_sha = ? LIMIT 1",
                             (subject_sha(name),)).fetchone():
        raise UserError(f"the name {name!r} owned data and has no account now (a removed account, or "
                        "RUBRICEM_MCP__OWNER): sessions, chats or feedback kept under it, or the record of their "
                        "deletion, would be taken for a new account's, so a name that owned data is never reused: pick "
                        "another name. To reset a password without removing the account, keep the account and run "
                        f"`rubricem users set-password {name}`")
