"""The `rubricem` command line: `main` and its parser live in `app.cli.main`; each subcommand group has its own
module here (bank, batch, deeprubric, loop, mcp, policy_server, resume, sft, train, ui, users), and `common` holds
what they share. The subcommand modules import from `common`, never from `main`, so `main` can import them all.
"""

from app.cli.main import main, parser

__all__ = ["main", "parser"]
