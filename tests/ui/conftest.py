"""UI test fixtures: putting services behind the page the way `rubricem ui` does."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from streamlit import config as st_config

from app.container import Services
from app.ui import state


@pytest.fixture
def put_services() -> Iterator[Callable[[Services, str | None], Services]]:
    """put(services, address): the page's services (`state.use`) and the address the UI is bound to (the access
    gate reads it; None is a plain `streamlit run`). Both are undone after the test."""

    def put(services: Services, address: str | None) -> Services:
        st_config.set_option("server.address", address)
        state.use(services)
        return services

    try:
        yield put
    finally:
        state.use(None)
        st_config.set_option("server.address", None)
