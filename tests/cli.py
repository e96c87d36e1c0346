"""`rubricem ...` in the test process (issue 61): the same entry point (`app.cli.main.main`) a console run takes,
with the environment, standard input and exit code a subprocess would have, without paying an interpreter start and
the imports of the whole app per call (a subprocess run is 2-4 s on 2 cores; 122 of them took 10-12 min of the suite).

Where the subprocess itself is the point (the console script, signals, a crash, output buffering), tests keep running
it as a subprocess.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CliResult:
    """What a run gave back, shaped like `subprocess.CompletedProcess` (the fields tests read)."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    """os.environ replaced by `env` for the call, then restored exactly."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_cli(args: Sequence[str], env: Mapping[str, str] | None = None, stdin: str = "") -> CliResult:
    """Run `rubricem ARGS` in process: `env` as the whole environment (default: the current one), `stdin` as its
    standard input. An argparse exit or any SystemExit becomes the exit code, as in a console run."""
    from app.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with _environment(env if env is not None else dict(os.environ)), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        saved_stdin = sys.stdin
        sys.stdin = io.StringIO(stdin)
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
        finally:
            sys.stdin = saved_stdin
    return CliResult(tuple(args), int(code), out.getvalue(), err.getvalue())
