"""The UI's long-lived objects: the settings and one set of services per server process (the policy loads once).

`use()` lets a host (the tests, an embedding application) hand in services it built itself; otherwise they are built
from the environment on first use.
"""

from __future__ import annotations

import threading

import streamlit as st

from app.container import Services, build
from app.settings import Settings
from app.ui.auth import LoginLimiter
from store.owner import LOCAL
from store.people import ScopedStore, Viewer
from store.session_log import SessionLog
from store.users import Users

_injected: Services | None = None
_limiter: LoginLimiter | None = None
_limiter_lock = threading.Lock()


def use(services: Services | None) -> None:
    """Serve these services instead of building them from the environment (None: back to building); the failed-login
    counts start afresh with them (they belong to one deployment's settings)."""
    global _injected, _limiter
    _injected, _limiter = services, None


def limiter() -> LoginLimiter:
    """The process's failed-login counts (app.ui.auth.LoginLimiter): one for every browser session of this server,
    so a reload or a new tab does not reset them."""
    global _limiter
    with _limiter_lock:  # every browser session runs in its own thread: make exactly one
        if _limiter is None:
            _limiter = LoginLimiter.from_config(settings().ui)
        return _limiter


@st.cache_resource(show_spinner="Loading the policy, the index and the rubric bank…")
def _built() -> Services:
    return build(_settings())


def services() -> Services:
    """The process's services."""
    return _injected if _injected is not None else _built()


@st.cache_resource(show_spinner=False)
def _settings() -> Settings:
    return Settings()


def settings() -> Settings:
    """The settings (read without building the services, so the login page loads nothing)."""
    return _injected.settings if _injected is not None else _settings()


@st.cache_resource(show_spinner=False)
def _people_log() -> SessionLog:
    return SessionLog.from_config(_settings().store)


def people_log() -> SessionLog:
    """The session log for logins and people (opened without loading the policy, so the login page stays light)."""
    return _injected.log if _injected is not None else _people_log()


def users() -> Users:
    """The accounts table."""
    return Users(people_log())


def has_accounts() -> bool:
    """Whether named password accounts exist (then even a loopback UI asks who you are)."""
    return any(u.kind == "password" for u in users().list())


def viewer() -> Viewer:
    """Who is looking, from the browser session (set at login; the open loopback UI is the local admin)."""
    return Viewer(str(st.session_state.get("user_id") or LOCAL), st.session_state.get("role") == "admin")


def scoped() -> ScopedStore:
    """The store as the visitor may see it: only their own sessions, threads and feedback (admins: everyone's)."""
    return ScopedStore(services().log, viewer())
