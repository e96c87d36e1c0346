"""`rubricem ui`: serve the Streamlit research chat (refuses to bind off loopback without a login)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from app.settings import Settings, child_environment
from app.ui.auth import access_policy

MAIN = Path(__file__).resolve().parents[1] / "ui" / "main.py"  # app/ui/main.py


def streamlit_command(host: str, port: int, max_upload_bytes: int = 200 << 20) -> list[str]:
    """The `streamlit run` command line for the UI (headless, no usage statistics, no file watcher). Streamlit holds
    an upload in memory, so it refuses one over the upload cap itself (`uploads.max_file_bytes`, in whole MiB)."""
    return [sys.executable, "-m", "streamlit", "run", str(MAIN),
            "--server.address", host, "--server.port", str(port), "--server.headless", "true",
            "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none",
            "--client.toolbarMode", "minimal", "--server.maxUploadSize", str(max(1, -(-max_upload_bytes // (1 << 20))))]


def _has_accounts(settings: Settings) -> bool:
    """Whether named password accounts exist (`rubricem users add`): they are a login, also off loopback."""
    from store.errors import StoreError
    from store.session_log import SessionLog
    from store.users import Users

    try:
        with SessionLog.from_config(settings.store) as log:
            return any(u.kind == "password" for u in Users(log).list())
    except StoreError:  # an unreachable store fails the page later, with its own message
        return False


def cmd_ui(args: argparse.Namespace) -> int:
    """Serve the UI until interrupted."""
    settings = Settings()
    host = args.host or settings.ui.host
    port = args.port or settings.ui.port
    policy = access_policy(host, settings.ui, accounts=_has_accounts(settings))  # UIAccessError before anything starts
    how = "login: " + ", ".join(policy.methods) if policy.login_required else "open on loopback"
    print(f"rubricem ui on http://{host}:{port} ({how}); Ctrl-C stops it", file=sys.stderr, flush=True)
    # The page reads its bind address from Streamlit's server.address, so the login rule follows --host. exec, not
    # a child process: a supervisor's SIGTERM (docker stop, a test fixture) then reaches Streamlit itself instead of
    # leaving it running, model loaded, after its parent is gone.
    command = streamlit_command(host, port, settings.uploads.max_file_bytes)
    # Streamlit's uvicorn reads X-Forwarded-For only from the peers named here (its default, loopback, would let
    # anyone behind an ssh -L or socat forwarder pick the address the login limit counts): none unless the operator
    # names their reverse proxies (issue 46).
    env = {**child_environment(), "FORWARDED_ALLOW_IPS": ",".join(settings.ui.trusted_proxies)}  # "": nobody's
    os.execve(command[0], command, env)
    return 0  # not reached


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register `ui` on the main parser."""
    u = sub.add_parser("ui", help="serve the Streamlit research chat (login required off loopback)")
    u.add_argument("--host", help="bind address (default RUBRICEM_UI__HOST, 127.0.0.1)")
    u.add_argument("--port", type=int, help="port (default RUBRICEM_UI__PORT, 8501)")
    u.set_defaults(func=cmd_ui)
