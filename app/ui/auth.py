"""Who may use the UI: open on loopback, a login everywhere else (a named account, the shared password from
settings as a one-user shortcut, or Streamlit's OIDC), and who each visitor is (their user id) and may do (role).

Plain Python, no Streamlit, so the rules are tested directly. Passwords are compared in constant time (named
accounts: bcrypt) and never logged or stored; the session only keeps the user id and role.
"""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass
from typing import Literal

from app.settings import UIConfig
from store.owner import LOCAL
from store.users import Users

Role = Literal["admin", "user"]


class UIAccessError(ValueError):
    """The UI would be exposed without any way to log in."""


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost; False for anything else (0.0.0.0 and a LAN address included)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:  # a host name other than localhost may resolve anywhere
        return False


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
    """Who is logged in: the owner of what they write (their history is theirs alone) and their role."""

    user_id: str
    role: Role


class LoginRefused(ValueError):
    """A login that cannot give anyone an identity (the message is safe to show)."""


def access_policy(host: str, ui: UIConfig, accounts: bool = False) -> AccessPolicy:
    """The access rules for a UI bound to `host`.

    Loopback without a password: open, and the local user is the admin. Loopback with a password or named accounts
    (`accounts`: `rubricem users add`), or any other address: a login is required. Off loopback with no password and no OIDC the UI refuses to start.

    Raises:
        UIAccessError: bound off loopback with no login configured.
    """
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


def oidc_role(email: str | None, ui: UIConfig, email_verified: object = None) -> Role:
    """An OIDC user's role: admin when their e-mail is listed in RUBRICEM_UI__ADMIN_EMAILS and the identity
    provider did not say it is unverified (`email_verified` False; providers that omit the claim pass None)."""
    admins = {e.strip().lower() for e in ui.admin_emails}
    if str(email_verified).lower() == "false":  # the bool False or a "false" string claim
        return "user"
    return "admin" if email and email.strip().lower() in admins else "user"


def password_login(name: str, given: str, ui: UIConfig, users: Users | None) -> Identity | None:
    """The identity a login form grants, or None (one answer for every failure, so names cannot be probed).

    With a name: that named account's bcrypt password. Without one: the deployment's shared passwords, a one-user
    shortcut that logs in as the local user (admin with the admin password)."""
    if name.strip():
        found = users.verify_password(name, given) if users is not None else None
        return Identity(found.user_id, found.role) if found is not None else None
    role = password_role(given, ui)
    return Identity(LOCAL, role) if role is not None else None


def oidc_identity(email: object, subject: object, ui: UIConfig, email_verified: object = None) -> Identity:
    """An OIDC user's identity: their e-mail (lower-cased), or without an e-mail claim their subject as
    `oidc:<sub>` (never an admin: admins are listed by e-mail).

    Raises:
        LoginRefused: the provider sent neither an e-mail nor a subject.
    """
    if isinstance(email, str) and email.strip():
        return Identity(email.strip().lower(), oidc_role(email, ui, email_verified))
    if isinstance(subject, str) and subject.strip():
        return Identity(f"oidc:{subject.strip()}", "user")
    raise LoginRefused("Your identity provider sent neither an e-mail address nor a subject, so this app cannot "
                       "tell who you are. Ask your administrator to add the email scope.")
