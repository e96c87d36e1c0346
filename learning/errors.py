"""Learning-side errors.

    LearningError
    └── JudgeError             the judge could not produce a result
        ├── JudgeUnavailable   the endpoint timed out / answered 429 or 5xx / refused the connection (after retries)
        ├── JudgeRequestError  the endpoint rejected the request (4xx other than 429)
        └── JudgeOutputInvalid the output was not valid JSON of the expected shape, even after one repair retry
"""

from __future__ import annotations

from typing import Any


class LearningError(Exception):
    """Base of the learning package's errors."""


class JudgeError(LearningError):
    """The judge could not produce a result.

    `usage` is what the failed call still cost (a `learning.judge.types.Usage`; None when nothing was billed): an
    invalid answer is billed like a valid one, so run summaries must count it.
    """

    def __init__(self, message: str = "", *, usage: Any = None) -> None:
        super().__init__(message)
        self.usage = usage


class JudgeUnavailable(JudgeError):
    """The judge endpoint kept failing (timeouts, 429, 5xx, connection errors) after its retries."""


class JudgeRequestError(JudgeError):
    """The judge endpoint rejected the request (4xx other than 429)."""


class JudgeOutputInvalid(JudgeError):
    """The judge's output was not valid JSON of the expected shape, even after one repair retry."""
