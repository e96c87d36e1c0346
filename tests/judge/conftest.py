"""Judge test fixtures: a scriptable OpenAI-compatible stand-in server (see tests/judge/openai_standin.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.judge.openai_standin import OpenAIStandIn


@pytest.fixture
def openai_standin() -> Iterator[OpenAIStandIn]:
    """A fresh stand-in per test (empty script, no API key check); closed after the test."""
    standin = OpenAIStandIn()
    try:
        yield standin
    finally:
        standin.close()
