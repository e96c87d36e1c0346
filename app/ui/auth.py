"""Who may use the UI: open on loopback, a login everywhere else (a named account, the shared password from
settings as a one-person shortcut, or Streamlit's OIDC), and who each visitor is (their user id) and may do (role).

Plain Python, no Streamlit, so the rules are tested directly. Passwords are compared in constant time (named
accounts: bcrypt) and never logged or stored; the session only keeps the user id and role.

One identity per human (issue 34): the shared passwords log in as `shared:user` / `shared:admin`, never as `local`
(the operator, who owns every CLI, batch, eval and MCP session and every row from before owners existed); OIDC
logins are keyed on the provider's issuer and subject, never on an e-mail claim anyone may be able to set. Names
with ':' cannot be password accounts, so neither namespace can be taken by an account.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
import re
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from app.settings import UIConfig
from store.errors import InvalidInput
from store.users import Users, check_user_id

Role = Literal["admin", "user"]
SHARED_USER = "shared:user"  # whoever knows RUBRICEM_UI__PASSWORD
SHARED_ADMIN = "shared:admin"  # whoever knows RUBRICEM_UI__ADMIN_PASSWORD
MIN_SECRET_CHARS = 12  # for the shared passwords (RUBRICEM_UI__PASSWORD, __ADMIN_PASSWORD); checked at start
_SAFE_SUBJECT = re.compile(r"^[A-Za-z0-9._~+=/-]{1,128}$")  # no '@' (ids with '@' are lower-cased) and no ':'


class UIAccessError(ValueError):
    """The UI would be exposed without any way to log in, or with a login too weak to serve."""


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost; False for anything else (0.0.0.0 and a LAN address included)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:  # a host name other than localhost may resolve anywhere
        return False


def host_header_is_loopback(header: str | None) -> bool:
    """Whether an HTTP Host header names this machine: localhost, 127.x.y.z or [::1], each with an optional port.

    A DNS-rebinding page reaches a loopback server under its own name (evil.example:8501 resolving to 127.0.0.1),
    and the browser then sends that name as the Host; a name that is not loopback is refused by the open UI.
    """
    text = (header or "").strip().lower()
    if not text:
        return False
    if text.startswith("["):  # [v6] or [v6]:port
        end = text.find("]")
        if end < 0 or (text[end + 1:] and not re.fullmatch(r":[0-9]{1,5}", text[end + 1:])):
            return False
        host = text[1:end]
        try:
            return ipaddress.IPv6Address(host).is_loopback
        except ValueError:
            return False
    host, _, port = text.partition(":")
    if port and not re.fullmatch(r"[0-9]{1,5}", port):
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.IPv4Address(host).is_loopback
    except ValueError:
        return False


def open_ui_host_refusal(headers: Mapping[str, str]) -> str | None:
    """Why the open loopback UI refuses this request (its Host header is not a loopback name), or None to serve it.

    No headers at all means there is no browser request behind the run (Streamlit's AppTest, an embedding host):
    every real HTTP request carries a Host header, so a request with other headers and no Host is refused too.
    """
    if not headers:
        return None
    host = next((v for k, v in headers.items() if k.lower() == "host"), None)
    if host_header_is_loopback(host):
        return None
    return (f"This UI has no login and answers only to localhost, 127.0.0.1 or [::1], not to {host or 'no host'!r} "
            "(a page on another site may be trying to reach it through your browser). Open it as "
            "http://localhost:<port>, or set RUBRICEM_UI__PASSWORD or named accounts to serve it under other names.")


@dataclass(frozen=True, slots=True)
class AccessPolicy:
    """How a UI bound to `host` lets people in."""

    login_required: bool
    password: bool  # the password form is offered
    oidc: bool  # the "Log in with ..." button is offered
    open_role: Role | None  # the role of everybody when no login is required

    @property
    def methods(self) -> tuple[str, ...]:
        return tuple(m for m, on in (("password", self.password), ("oidc", self.oidc)) if on)


@dataclass(frozen=True, slots=True)
class Identity:
    """Who is logged in: the owner of what they write (their history is theirs alone) and their role; `label` is
    what the page shows them (a verified e-mail, else the id)."""

    user_id: str
    role: Role
    label: str = field(default="", compare=False)
    # A named account's login key (`Users.login_key`) when this login was made: the account made again under its
    # name, or given a new password, has another key, and then this login is not its login (`recheck`).
    login_key: str = field(default="", compare=False, repr=False)


class LoginRefused(ValueError):
    """A login that cannot give anyone an identity (the message is safe to show)."""


def check_secrets(ui: UIConfig) -> None:
    """Refuse shared passwords shorter than MIN_SECRET_CHARS: the login form is the only way to guess them, and it
    backs off, but a "pw" falls to the first few guesses of anyone.

    Raises:
        UIAccessError: naming the setting to change.
    """
    for name, secret in (("RUBRICEM_UI__PASSWORD", ui.password), ("RUBRICEM_UI__ADMIN_PASSWORD", ui.admin_password)):
        if secret is not None and len(secret.get_secret_value()) < MIN_SECRET_CHARS:
            raise UIAccessError(
                f"{name} is {len(secret.get_secret_value())} characters long; it needs at least {MIN_SECRET_CHARS}. "
                "Choose a longer one (e.g. `python -c 'import secrets; print(secrets.token_urlsafe(18))'`), or "
                "unset it and use named accounts (`rubricem users add`).")


def access_policy(host: str, ui: UIConfig, accounts: bool = False) -> AccessPolicy:
    """The access rules for a UI bound to `host`.

    Loopback without a password: open, and the local user is the admin. Loopback with a password or named accounts
    (`accounts`: `rubricem users add`), or any other address: a login is required. Off loopback with no password
    and no OIDC the UI refuses to start, and so it does with a shared password shorter than MIN_SECRET_CHARS.

    Raises:
        UIAccessError: bound off loopback with no login configured, or a shared password too short.
    """
    check_secrets(ui)
    has_password = ui.password is not None or ui.admin_password is not None or accounts
    if is_loopback(host) and not has_password and not ui.oidc:
        return AccessPolicy(login_required=False, password=False, oidc=False, open_role="admin")
    if not has_password and not ui.oidc:
        raise UIAccessError(
            f"refusing to serve the UI on {host} without a login: set RUBRICEM_UI__PASSWORD (and optionally "
            "RUBRICEM_UI__ADMIN_PASSWORD), or RUBRICEM_UI__OIDC=true with an [auth] section in "
            ".streamlit/secrets.toml, or bind 127.0.0.1")
    return AccessPolicy(login_required=True, password=has_password, oidc=ui.oidc, open_role=None)


def _same(given: str, secret: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8"), secret.encode("utf-8"))


def password_role(given: str, ui: UIConfig) -> Role | None:
    """The role a password grants (admin password first), or None for a wrong or empty one."""
    if not given:
        return None
    if ui.admin_password is not None and _same(given, ui.admin_password.get_secret_value()):
        return "admin"
    if ui.password is not None and _same(given, ui.password.get_secret_value()):
        return "user"
    return None


def is_true_claim(value: object) -> bool:
    """An OIDC boolean claim that is really true: the JSON true, or the string "true" some providers send.
    Anything else (absent, False, "false", "yes", 1) is not."""
    return value is True or (isinstance(value, str) and value.strip().lower() == "true")


def oidc_role(email: str | None, ui: UIConfig, email_verified: object = None) -> Role:
    """An OIDC user's role: admin only when the provider says their e-mail is verified (`email_verified` truly
    true, see is_true_claim) and it is listed in RUBRICEM_UI__ADMIN_EMAILS. A provider that omits the claim, or
    lets people set an address it never checked, makes nobody an admin by e-mail."""
    if not is_true_claim(email_verified) or not isinstance(email, str):
        return "user"
    admins = {e.strip().lower() for e in ui.admin_emails}
    return "admin" if email.strip().lower() in admins else "user"


def password_login(name: str, given: str, ui: UIConfig, users: Users | None) -> Identity | None:
    """The identity a login form grants, or None (one answer for every failure, so names cannot be probed).

    With a name: that named account's bcrypt password. Without one: the deployment's shared passwords, a one-person
    shortcut that logs in as `shared:admin` (admin password) or `shared:user` - never as `local`, the operator who
    owns the CLI's sessions. Everyone who knows a shared password shares that one identity and sees each other's
    chats: several people get named accounts (`rubricem users add`)."""
    if name.strip():
        signed = users.sign_in(name, given) if users is not None else None
        if signed is None:
            return None
        found, key = signed
        return Identity(found.user_id, found.role, found.user_id, login_key=key)
    role = password_role(given, ui)
    if role is None:
        return None
    uid = SHARED_ADMIN if role == "admin" else SHARED_USER
    return Identity(uid, role, uid)


def oidc_user_id(issuer: str, subject: str) -> str:
    """The user id of an OIDC login: `oidc:<first 12 hex of sha256(issuer)>:<subject>`.

    The issuer and subject are the only claims that name one account at one provider for good (an e-mail can be
    unverified, self-set or reassigned). The issuer is hashed to keep the id short; a subject with characters
    outside letters, digits and ._~+=/- (an '@' would be lower-cased as an e-mail), or longer than 128, is replaced
    by `#` and 40 hex of its sha256, which no plain subject can spell.

    Rows written before issue 34 under an e-mail (or `oidc:<sub>`) stay with that id: they are not handed to the new
    id, because the e-mail claim they were keyed on is exactly what could not be trusted. Admins still see them;
    `rubricem users delete-data <e-mail>` removes them.
    """
    iss = hashlib.sha256(issuer.strip().encode("utf-8")).hexdigest()[:12]
    sub = subject.strip()
    if not _SAFE_SUBJECT.match(sub):
        sub = "#" + hashlib.sha256(sub.encode("utf-8")).hexdigest()[:40]
    return f"oidc:{iss}:{sub}"


def oidc_identity(claims: Mapping[str, object], ui: UIConfig) -> Identity:
    """An OIDC user's identity from the ID token's claims (`st.user`): keyed on `iss` and `sub` (oidc_user_id);
    the e-mail decides the role and the label only when `email_verified` is truly true.

    Raises:
        LoginRefused: the provider sent no issuer or no subject.
    """
    issuer, subject = claims.get("iss"), claims.get("sub")
    if not (isinstance(issuer, str) and issuer.strip() and isinstance(subject, str) and subject.strip()):
        raise LoginRefused("Your identity provider did not say who you are (its token has no issuer or no subject), "
                           "so this app cannot give you an identity. Ask your administrator to check the [auth] "
                           "section of .streamlit/secrets.toml.")
    uid = oidc_user_id(issuer, subject)
    email, verified = claims.get("email"), claims.get("email_verified")
    role = oidc_role(email if isinstance(email, str) else None, ui, verified)
    label = email.strip().lower() if isinstance(email, str) and email.strip() and is_true_claim(verified) else uid
    return Identity(uid, role, label)


def recheck(user_id: str, ui: UIConfig, policy: AccessPolicy, users: Users,
            claims: Mapping[str, object] | None, login_key: str | None = None) -> Identity | None:
    """Who a signed-in browser session is now, with the role the deployment gives it now; None when its login no
    longer holds. Asked at every page load (issue 46): a login is not a licence kept until logout.

    - a named account: it must still exist with the login key the session signed in with (`login_key`, issue 65:
      an account removed and made again under its name, or given a new password by `rubricem users set-password`,
      has a new key, so no browser signed in before is signed in to it), and its role is the one on its row;
    - `shared:admin` / `shared:user`: their password must still be set;
    - an OIDC login: the provider's token (`claims`, None when logged out there) must still name the same issuer and
      subject, and the role follows RUBRICEM_UI__ADMIN_EMAILS as it is now;
    - anything else (`local` from the open UI, once named accounts or a password require a login): None.
    """
    if not policy.login_required:
        return None  # the open UI gives everyone `local` afresh on every load; nothing to re-check
    if user_id == SHARED_ADMIN:
        return Identity(SHARED_ADMIN, "admin", SHARED_ADMIN) if ui.admin_password is not None else None
    if user_id == SHARED_USER:
        return Identity(SHARED_USER, "user", SHARED_USER) if ui.password is not None else None
    if user_id.startswith("oidc:"):
        return _recheck_oidc(user_id, ui, policy, claims)
    return _recheck_account(user_id, users, login_key)


def _recheck_account(user_id: str, users: Users, login_key: str | None) -> Identity | None:
    """A named account's login, if the account is still the one it signed in to (same login key, compared in
    constant time); a session without a key (made before keys existed) must log in again."""
    current = users.login_key(user_id)
    given = login_key.encode("utf-8") if isinstance(login_key, str) else b""
    if current is None or not given or not hmac.compare_digest(current.encode("ascii"), given):
        return None
    found = users.find(user_id)
    if found is None or found.kind != "password":
        return None
    return Identity(found.user_id, found.role, found.user_id, login_key=current)


def _recheck_oidc(user_id: str, ui: UIConfig, policy: AccessPolicy,
                  claims: Mapping[str, object] | None) -> Identity | None:
    if not policy.oidc or claims is None:
        return None
    try:
        who = oidc_identity(claims, ui)
    except LoginRefused:
        return None
    return who if who.user_id == user_id else None


# ---- slowing guesses down ------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Strikes:
    failures: int = 0
    last: float = 0.0


@dataclass(frozen=True, slots=True)
class LoginOutcome:
    """What a login attempt gave: an identity, or a message to show (nothing changed but the failure count)."""

    identity: Identity | None
    message: str = ""


def _address_key(address: str | None) -> str:
    """The key of a client address: IPv6 by its /64 (one host usually holds the whole /64), None as loopback."""
    if not address:
        return "addr:loopback"
    try:
        ip = ipaddress.ip_address(address.strip().strip("[]"))
    except ValueError:
        return f"addr:{address.strip()[:64]}"
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return f"addr:{ip.ipv4_mapped}"
        return "addr:" + str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))
    return f"addr:{ip}"


def _name_key(name: str) -> str:
    if not name.strip():
        return "name:"  # the shared passwords: one secret, one counter
    try:
        return "name:" + check_user_id(name)
    except InvalidInput:
        return "name:" + name.strip()[:64]


class LoginLimiter:
    """Failed logins, counted per client address and per account name, in this server process.

    After `free` failures on a key, every further attempt on it waits 2 s, 4 s, 8 s ... (at most `max_backoff_s`)
    after the last failure; attempts during the wait are refused before any password is checked, so they cost no
    bcrypt work and do not count. A key is forgotten an hour (or 4 x max_backoff_s) after its last failure. A global
    budget of `checks_per_s` password checks (burst: twice that) keeps a spray from many addresses from filling the
    CPU with bcrypt.

    Kept in the process, not the store: Streamlit serves every browser session from this one process, a reload
    keeps it, and a failed guess then costs no database write. A restart forgets it (an admin's way to unlock an
    account someone else locked by guessing). The address is the connecting peer's: `rubricem ui` lets Streamlit
    take X-Forwarded-For only from RUBRICEM_UI__TRUSTED_PROXIES (none by default, so behind an unnamed reverse proxy
    every visitor shares the proxy's address, and a forged header from anyone else changes nothing).
    """

    def __init__(self, free: int = 5, max_backoff_s: float = 900.0, checks_per_s: float = 5.0,
                 max_keys: int = 100_000) -> None:
        self.free, self.max_backoff_s, self.checks_per_s, self.max_keys = free, max_backoff_s, checks_per_s, max_keys
        self._strikes: dict[str, _Strikes] = {}
        self._refilled: float | None
        self._tokens, self._refilled = 2 * checks_per_s, None  # a full bucket until the first check
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, ui: UIConfig) -> LoginLimiter:
        return cls(ui.login_free_attempts, ui.login_max_backoff_s, ui.login_checks_per_s)

    def _forget_after(self) -> float:
        return max(3600.0, 4 * self.max_backoff_s)

    def _wait(self, key: str, now: float) -> float:
        s = self._strikes.get(key)
        if s is None or s.failures < self.free:
            return 0.0
        backoff = min(self.max_backoff_s, 2.0 ** (s.failures - self.free + 1))
        return max(0.0, s.last + backoff - now)

    def wait_s(self, keys: Iterable[str], now: float | None = None) -> float:
        """Seconds until these keys may try again (0: now)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            return max((self._wait(k, now) for k in keys), default=0.0)

    def take_check(self, now: float | None = None) -> bool:
        """Spend one password check from the global budget; False when it is empty."""
        now = time.monotonic() if now is None else now
        with self._lock:
            cap = 2 * self.checks_per_s
            elapsed = 0.0 if self._refilled is None else max(0.0, now - self._refilled)
            self._tokens = min(cap, self._tokens + elapsed * self.checks_per_s)
            self._refilled = now
            if self._tokens < 1:
                return False
            self._tokens -= 1
            return True

    def failed(self, keys: Iterable[str], now: float | None = None) -> None:
        """Count one failure on each key."""
        now = time.monotonic() if now is None else now
        with self._lock:
            for k in keys:
                s = self._strikes.get(k)
                if s is None or now - s.last > self._forget_after():
                    s = _Strikes()
                s.failures, s.last = s.failures + 1, now
                self._strikes.pop(k, None)
                self._strikes[k] = s  # most recent last, so the oldest go first when full
            while len(self._strikes) > self.max_keys:
                self._strikes.pop(next(iter(self._strikes)))

    def succeeded(self, name_key: str) -> None:
        """A right password clears its account's count (not the address's: logging in to one's own account must not
        reset the guessing of another's)."""
        with self._lock:
            self._strikes.pop(name_key, None)


def attempt_password_login(name: str, given: str, ui: UIConfig, users: Users | None, limiter: LoginLimiter,
                           address: str | None, now: float | None = None) -> LoginOutcome:
    """One submission of the login form from `address`: refused before any password check while the address or
    the name is backing off, or while the server's check budget is spent; otherwise password_login, counting a
    failure on both keys."""
    keys = (_address_key(address), _name_key(name))
    wait = limiter.wait_s(keys, now)
    if wait > 0:
        return LoginOutcome(None, f"Too many failed logins from your address or for this name: try again in "
                                  f"{math.ceil(wait)} s.")
    if not limiter.take_check(now):
        return LoginOutcome(None, "The server is checking many logins right now: try again in a few seconds.")
    who = password_login(name, given, ui, users)
    if who is None:
        limiter.failed(keys, now)
        return LoginOutcome(None, "Wrong name or password.")
    limiter.succeeded(keys[1])
    return LoginOutcome(who)
