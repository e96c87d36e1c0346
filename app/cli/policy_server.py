"""`rubricem policy-server`: run a local vLLM (CPU build, `make vllm`) serving the policy until interrupted."""

from __future__ import annotations

import argparse
from pathlib import Path

from app.settings import Settings


def cmd_policy_server(args: argparse.Namespace) -> int:
    """Start vLLM with the flags the app needs, say where it listens, and stop it cleanly on Ctrl-C or SIGTERM."""
    from app.policy_server import serve_forever, spec_from_settings

    settings = Settings()
    spec = spec_from_settings(settings, model_dir=args.model, port=args.port, host=args.host)
    return serve_forever(spec, start_timeout_s=settings.policy_server.start_timeout_s)


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register `policy-server` on the main parser."""
    p = sub.add_parser("policy-server", help="serve the policy with a local vLLM (CPU build from `make vllm`)")
    p.add_argument("--host", help="bind address (default: the host of RUBRICEM_AGENT__POLICY_BASE_URL, 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default: the port of RUBRICEM_AGENT__POLICY_BASE_URL, 8000)")
    p.add_argument("--model", type=Path, help="model folder (default: the converted SmolLM2 in the data folder)")
    p.set_defaults(func=cmd_policy_server)
