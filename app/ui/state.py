"""The UI's long-lived objects: the settings and one set of services per server process (the policy loads once).

`use()` lets a host (the tests, an embedding application) hand in services it built itself; otherwise they are built
from the environment on first use.
"""

from __future__ import annotations

import streamlit as st

from app.container import Services, build
from app.settings import Settings

_injected: Services | None = None


def use(services: Services | None) -> None:
    """Serve these services instead of building them from the environment (None: back to building)."""
    global _injected
    _injected = services


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
