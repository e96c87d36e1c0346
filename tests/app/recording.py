"""The real `ResearchService`, keeping each outcome it returns (a batch run or an MCP call shows only what it writes;
a test that compares that with `ask --json` needs the outcome itself). Nothing is replaced: `run` is the service's own.
"""

from __future__ import annotations

from typing import Any

from app.service import ResearchOutcome, ResearchService


class RecordingService(ResearchService):
    """`ResearchService` that appends every outcome `run` returns to `outcomes`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outcomes: list[ResearchOutcome] = []

    async def run(self, *args: Any, **kwargs: Any) -> ResearchOutcome:
        outcome = await super().run(*args, **kwargs)
        self.outcomes.append(outcome)
        return outcome
