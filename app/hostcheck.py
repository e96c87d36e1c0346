"""Who may reach an HTTP endpoint of ours (issues 34, 46): which binds may serve without a secret, and which Host and
Origin headers a request may carry.

One rule for every endpoint: the MCP server (`app.mcp_server`, through the MCP SDK's TransportSecuritySettings), the
scheduler's Prometheus endpoint (`app.metrics`) and `rubricem policy-server` (`app.policy_server`, the bind check).
The Host check is the DNS-rebinding protection: a web page whose name an attacker points at 127.0.0.1 (or at a
private address) sends its own name as Host, and is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

OPEN_HOSTS = ("127.0.0.1", "localhost", "::1")  # the exact binds that may serve without a secret
WILDCARD_HOSTS = ("0.0.0.0", "::")  # every interface: the Host header clients send cannot be derived from these
MIN_SECRET_CHARS = 32  # a shared secret short enough to guess or brute-force is no lock


class HostRuleError(ValueError):
    """The endpoint's allowed Host names cannot be derived from its bind address (a wildcard with no names)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request was refused: the status the SDK answers with (421 for the Host, 403 for the Origin)."""

    status: int
    reason: str


@dataclass(frozen=True, slots=True)
class HostRule:
    """The Host headers an endpoint answers to, and the Origins a request may come from (when it sends one)."""

    hosts: tuple[str, ...]
    origins: tuple[str, ...]

    def refusal(self, host: str | None, origin: str | None) -> Refusal | None:
        """None when a request with these headers may be served; the MCP SDK's checks, in its order."""
        if not host or host not in self.hosts:
            return Refusal(421, "Invalid Host header")
        if origin and origin not in self.origins:
            return Refusal(403, "Invalid Origin header")
        return None


def is_open_host(host: str) -> bool:
    """Whether `host` may be bound without a secret: only the exact loopback binds 127.0.0.1, localhost and ::1.
    Other 127.x addresses are loopback too, but the MCP SDK (and people) treat them as "some other address": asking
    for a secret there costs nothing and keeps one rule."""
    return host.strip().lower() in OPEN_HOSTS


def host_rule(host: str, port: int, extra_hosts: Sequence[str] = (), *, who: str, setting: str) -> HostRule:
    """The Host rule of an endpoint bound to `host:port`: the bind address (for a loopback bind, any loopback name)
    or one of `extra_hosts`, at `port` unless the entry names its own; a listed name is allowed bare too (behind a
    TLS proxy the Host header is the public name alone). An Origin must be one of those hosts over http or https.

    Raises:
        HostRuleError: a wildcard bind (0.0.0.0, ::) with no `extra_hosts`; the message names `who` and `setting`.
    """
    bind = host.strip().lower()
    if bind in WILDCARD_HOSTS and not extra_hosts:
        raise HostRuleError(
            f"{who} on {host} listens on every interface, so it cannot tell which Host names are its own: set "
            f'{setting} to the names clients use, as a JSON list (e.g. ["mcp.example.org", "10.0.0.5"]), or bind '
            "one address.")
    names = list(OPEN_HOSTS) if bind in OPEN_HOSTS else ([] if bind in WILDCARD_HOSTS else [bind])
    extra = [h.strip().lower() for h in extra_hosts if h.strip()]
    hosts: list[str] = []
    for entry in [*(host_header(n, port) for n in [*names, *extra]), *extra]:
        if entry not in hosts:
            hosts.append(entry)
    return HostRule(tuple(hosts), tuple(f"{scheme}://{h}" for h in hosts for scheme in ("http", "https")))


def host_header(name: str, port: int) -> str:
    """`name` as a Host header: with `port` unless it names one; a bare IPv6 address in brackets."""
    if name.startswith("["):  # [v6] or [v6]:port
        return name if "]:" in name else f"{name}:{port}"
    if name.count(":") > 1:  # a bare IPv6 address
        return f"[{name}]:{port}"
    return name if ":" in name else f"{name}:{port}"
