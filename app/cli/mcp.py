"""`rubricem mcp`: serve the agent as an MCP server (stdio for desktop clients, or streamable HTTP on a port; over
HTTP it also answers GET /metrics for Prometheus, see `app.mcp_server.mount_metrics`)."""

from __future__ import annotations

import argparse
import contextlib
import sys

from app.cli.common import Progress
from app.settings import Settings


def cmd_mcp(args: argparse.Namespace) -> int:
    """Build the services once, then serve until the client closes stdin (stdio) or Ctrl-C (HTTP)."""
    import anyio

    from app.container import build
    from app.mcp_server import build_server, check_bind, mount_metrics, transport_security
    from app.metrics import METRICS_PATH, metrics_registry

    settings = Settings()
    cfg = settings.mcp
    transport = args.transport or cfg.transport
    host = args.host or cfg.host
    port = args.port or cfg.port
    token = cfg.token.get_secret_value() if cfg.token is not None else None
    security = None
    if transport == "http":  # McpAccessError (a ValueError) before anything loads
        check_bind(host, token)
        security = transport_security(host, port, cfg.allowed_hosts)
        if cfg.path.rstrip("/") == METRICS_PATH:
            raise ValueError(f"RUBRICEM_MCP__PATH cannot be {METRICS_PATH}: the HTTP server serves Prometheus there")
    progress = Progress(args.quiet)
    # stdio: stdout carries protocol messages only, so whatever loading prints goes to stderr.
    with contextlib.redirect_stdout(sys.stderr):
        services = build(settings, say=progress.say, progress=progress.bar)
    url = f"http://{host}:{port}{cfg.path}"
    server = build_server(services, token=token if transport == "http" else None, base_url=url,
                          on_event=progress.event, owner=cfg.owner, max_concurrent_runs=cfg.max_concurrent_runs)
    if transport == "http":
        mount_metrics(server, metrics_registry(services.log), token=token, security=security, path=METRICS_PATH)

    async def serve() -> None:
        try:
            if transport == "stdio":
                progress.say(f"rubricem mcp on stdio as {cfg.owner!r} (tools: research, search_bank, get_session)")
                await server.run_stdio_async()
            else:
                how = "bearer token required" if token else "open on loopback"
                progress.say(f"rubricem mcp on {url} as {cfg.owner!r} ({how}; Prometheus: {METRICS_PATH}); "
                             "Ctrl-C stops it")
                await server.run_streamable_http_async(host=host, port=port, streamable_http_path=cfg.path,
                                                       transport_security=security)
        finally:
            await services.policy.aclose()

    anyio.run(serve)
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register `mcp` on the main parser."""
    m = sub.add_parser("mcp", help="serve the agent as an MCP server (research, search_bank, get_session)")
    m.add_argument("--transport", choices=["stdio", "http"], help="default RUBRICEM_MCP__TRANSPORT (stdio)")
    m.add_argument("--host", help="HTTP bind address (default RUBRICEM_MCP__HOST, 127.0.0.1; any but 127.0.0.1, "
                   "localhost and ::1 needs RUBRICEM_MCP__TOKEN)")
    m.add_argument("--port", type=int, help="HTTP port (default RUBRICEM_MCP__PORT, 8765)")
    m.add_argument("--quiet", action="store_true", help="no progress on stderr")
    m.set_defaults(func=cmd_mcp)
