"""Who may use the UI: open on loopback, a login everywhere else (a password from settings, or Streamlit's OIDC).

Plain Python, no Streamlit, so the rules are tested directly. Passwords are compared in constant time and never
logged or stored; the session only keeps the role.
"""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass
from typing import Literal

from app.settings import UIConfig

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


def access_policy(host: str, ui: UIConfig) -> AccessPolicy:
    """The access rules for a UI bound to `host`.

    Loopback without a password: open, and the local user is the admin. Loopback with a password, or any other
    address: a login is required. Off loopback with no password and no OIDC the UI refuses to start.

    Raises:
        UIAccessError: bound off loopback with no login configured.
    """
    has_password = ui.password is not None or ui.admin_password is not None
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
