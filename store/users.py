"""People who use the app (migration 0008): named accounts for password logins, OIDC and local identities, their
role and their consent to learn from their sessions. Kind "local" is an identity the deployment itself defines:
`local` (the operator: the CLI, the open loopback UI) and the UI's shared-password ids `shared:user`/`shared:admin`.

Passwords are hashed with bcrypt and never stored, logged or put in an error message; a `UserRecord` carries no hash.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import bcrypt

from store.errors import InvalidInput, StoreError
from store.owner import LOCAL, MCP
from store.session_log import SessionLog

UserKind = Literal["password", "oidc", "local"]
UserRole = Literal["user", "admin"]
MAX_USER_ID = 254  # an e-mail address at most
_BCRYPT_MAX_BYTES = 72  # bcrypt 5 refuses longer passwords instead of truncating them silently
_MIN_PASSWORD = 8
# No '@': an address belongs to an OIDC login, and an account named like one could be taken for it. No ':': the
# `shared:` and `oidc:` ids of the UI's other logins live there, so no account can ever be one of them.
_ACCOUNT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


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


def hash_password(password: str) -> str:
    """The bcrypt hash of a password.

    Raises:
        InvalidInput: shorter than 8 characters, or longer than bcrypt's 72 bytes (UTF-8) - refused rather than
            truncated, so two long passwords with the same start never log in as each other.
    """
    if not isinstance(password, str) or len(password) < _MIN_PASSWORD:
        raise InvalidInput(f"a password needs at least {_MIN_PASSWORD} characters")
    raw = password.encode("utf-8")
    if len(raw) > _BCRYPT_MAX_BYTES:
        raise InvalidInput(f"a password may be at most {_BCRYPT_MAX_BYTES} bytes (UTF-8) long; this one is "
                           f"{len(raw)}")
    return bcrypt.hashpw(raw, bcrypt.gensalt()).decode("ascii")


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
        """Create a person. Password accounts need a password; OIDC and local identities must not have one.

        Raises:
            InvalidInput: a bad id, kind, role or password (nothing written).
            UserError: the id is taken.
        """
        uid = check_user_id(user_id)
        if kind not in ("password", "oidc", "local") or role not in ("user", "admin"):
            raise InvalidInput("kind must be password, oidc or local; role user or admin")
        # `Local` or `MCP` would read as the operator or the MCP identity in every owner list, so case is ignored.
        if kind == "password" and (password is None or not _ACCOUNT_NAME.match(uid) or uid.lower() in (LOCAL, MCP)):
            raise InvalidInput(
                "a password account needs a password and a name of letters, digits and ._+- other than 'local' and "
                "'mcp' (no '@': e-mail addresses are OIDC logins, so a password account can never stand in for one; "
                "pick a plain name such as 'alice')")
        if kind != "password" and password is not None:
            raise InvalidInput(f"a {kind} identity has no password")
        hashed = hash_password(password) if password is not None else None
        with self.log.transaction(write=True) as conn:
            if conn.execute("SELECT 1 FROM users WHERE user_id = ?", (uid,)).fetchone():
                raise UserError(f"user {uid!r} already exists")
            conn.execute("INSERT INTO users (user_id, kind, role, password_hash, consent, created_at) "
                         "VALUES (?, ?, ?, ?, ?, ?)",
                         (uid, kind, role, hashed, None if consent is None else int(consent), self.log.now()))
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
        """Delete the account (their sessions stay, until `delete_user_data`). Raises UnknownUser."""
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
        try:
            uid = check_user_id(user_id)
        except InvalidInput:
            return None
        with self.log.transaction(write=False) as conn:
            row = conn.execute("SELECT password_hash FROM users WHERE user_id = ? AND kind = 'password'",
                               (uid,)).fetchone()
        raw = password.encode("utf-8") if isinstance(password, str) else b""
        if not raw or len(raw) > _BCRYPT_MAX_BYTES:
            return None
        if row is None:  # spend a hash check anyway, so timing does not tell which names exist
            bcrypt.checkpw(raw, _dummy_hash())
            return None
        try:
            ok = bcrypt.checkpw(raw, str(row[0]).encode("ascii"))
        except ValueError:  # a corrupt hash is a failed login, and its text never reaches a message
            return None
        return self.get(uid) if ok else None
