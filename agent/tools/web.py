"""Shared HTTP plumbing for the web tools: JSON calls to search APIs, and the SSRF-guarded page fetcher.

`check_url` refuses anything but public http(s) addresses after DNS resolution; `WebPageFetcher` re-checks every
redirect hop and connects to the very address it checked (the hostname travels in the Host header and TLS SNI), so
a DNS answer that changes between check and connect (DNS rebinding) cannot redirect it to an internal service.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import re
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from agent.errors import SearchError, UnsafeURLError

USER_AGENT = "rubricem/0.1 (research agent)"
API_MAX_BYTES = 5_000_000  # a search API answer larger than this is broken or hostile
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
PAGE_CONTENT_TYPES = frozenset({"text/html", "application/xhtml+xml", "text/plain"})

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Hostnames that name cloud metadata services or never denote a public host.
BLOCKED_HOSTNAMES = frozenset(
    {"localhost", "metadata", "metadata.google.internal", "metadata.goog", "instance-data", "metadata.azure.com"}
)
BLOCKED_HOST_SUFFIXES = (".localhost", ".internal", ".local", ".localdomain", ".home.arpa")
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200", "192.0.0.192")
)
# Not covered (or not reliably covered across Python versions) by ipaddress's is_private/is_global.
EXTRA_BLOCKED_NETWORKS = tuple(
    ipaddress.ip_network(n)
    for n in ("100.64.0.0/10", "192.0.0.0/24", "198.18.0.0/15", "0.0.0.0/8", "240.0.0.0/4", "64:ff9b:1::/48")
)
NAT64_PREFIX = ipaddress.ip_network("64:ff9b::/96")
_NUMERIC_HOST = re.compile(r"^(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+)){0,3}$")


class ServiceStatusError(SearchError):
    """A search service answered an error status; `status_code` lets callers tell e.g. 403 from 500."""

    def __init__(self, message: str, status_code: int) -> None:
        """Keep the status next to the model-facing message."""
        super().__init__(message)
        self.status_code = status_code


@dataclass(frozen=True, slots=True)
class CheckedURL:
    """A URL that passed the guard, with the addresses its host resolved to (all of them public)."""

    url: httpx.URL
    host: str  # ASCII (IDNA) hostname without a trailing dot, or an IP literal
    port: int
    addresses: tuple[str, ...]


def address_refusal(ip: IPAddress) -> str | None:
    """Why `ip` must not be fetched (None when it is a public unicast address)."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:  # ::ffff:a.b.c.d is a.b.c.d on the wire
            return address_refusal(ip.ipv4_mapped)
        for embedded in _embedded_ipv4(ip):  # NAT64, 6to4 and Teredo forms reach an IPv4 host
            reason = address_refusal(embedded)
            if reason is not None:
                return reason
    if ip in METADATA_ADDRESSES:
        return "a cloud metadata address"
    checks = (
        (ip.is_loopback, "a loopback address"),
        (ip.is_unspecified, "an unspecified address"),
        (ip.is_link_local, "a link-local address"),
        (ip.is_multicast, "a multicast address"),
        (any(ip in net for net in EXTRA_BLOCKED_NETWORKS), "a shared or reserved address"),
        (ip.is_private, "a private address"),
        (ip.is_reserved, "a reserved address"),
        (not ip.is_global, "not a public address"),
    )
    return next((reason for refused, reason in checks if refused), None)


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    found = []
    if ip in NAT64_PREFIX:
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.append(ip.teredo[1])
    return found


def _literal_address(host: str) -> IPAddress | None:
    """The address a host string denotes by itself, or None for a name.

    Covers IPv4/IPv6 literals and the legacy numeric forms C resolvers accept (2130706433, 0x7f000001, 127.1).
    """
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if _NUMERIC_HOST.match(host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def parse_url(url: str) -> httpx.URL:
    """Parse and check the form of a URL (scheme, host, no credentials).

    Raises:
        UnsafeURLError: not an absolute http(s) URL with a host, or it carries user:password.
    """
    try:
        parsed = httpx.URL(url.strip())
    except (httpx.InvalidURL, TypeError) as exc:
        raise UnsafeURLError(f"refused: not a valid URL ({exc})") from exc
    if parsed.scheme not in ("http", "https"):
        raise UnsafeURLError(f"refused: only http and https URLs can be fetched, not {parsed.scheme or 'none'!r}")
    if not parsed.host:
        raise UnsafeURLError("refused: the URL has no host")
    if parsed.userinfo:
        raise UnsafeURLError("refused: URLs with credentials (user:password@) are not fetched")
    return parsed


def resolve_and_check(url: str | httpx.URL, allow_hosts: frozenset[str] = frozenset()) -> CheckedURL:
    """Parse `url`, resolve its host and verify every address is public.

    Args:
        url: the URL to check.
        allow_hosts: hostnames exempt from the address check (tests with 127.0.0.1 servers); empty in production.

    Raises:
        UnsafeURLError: bad scheme or form, a blocked hostname, an unresolvable host, or any non-public address.
    """
    parsed = parse_url(str(url))
    host = parsed.raw_host.decode("ascii").lower().rstrip(".")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    exempt = host in allow_hosts
    if not exempt and (host in BLOCKED_HOSTNAMES or host.endswith(BLOCKED_HOST_SUFFIXES)):
        raise UnsafeURLError(f"refused: {host!r} is an internal or metadata hostname")
    literal = _literal_address(host)
    if literal is not None:
        addresses: list[IPAddress] = [literal]
    else:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError, OSError) as exc:
            raise UnsafeURLError(f"refused: the host {host!r} could not be resolved") from exc
        addresses = [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]
        if not addresses:
            raise UnsafeURLError(f"refused: the host {host!r} could not be resolved")
    if not exempt:
        # Every address must pass: otherwise the connection could pick the bad one.
        for ip in addresses:
            reason = address_refusal(ip)
            if reason is not None:
                raise UnsafeURLError(f"refused: {host!r} resolves to {reason}")
    # Connect over IPv4 when an IPv6 address is only a mapped IPv4 one.
    normal = [
        str(ip.ipv4_mapped) if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped else str(ip) for ip in addresses
    ]
    return CheckedURL(url=parsed, host=host, port=port, addresses=tuple(dict.fromkeys(normal)))


def check_url(url: str) -> None:
    """Refuse a URL the agent must not fetch (SSRF guard).

    Allows only http/https URLs whose host resolves exclusively to public unicast addresses: loopback, private
    (10/8, 172.16/12, 192.168/16, fc00::/7), link-local, multicast, reserved, unspecified, CGNAT (100.64/10),
    IPv4-mapped/NAT64/6to4/Teredo forms of those, and cloud metadata endpoints are refused.

    Raises:
        UnsafeURLError: with a short reason that is safe to show to the model.
    """
    resolve_and_check(url)


# ---- search API calls -------------------------------------------------------------------------------------------


def _redact(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def _error_detail(body: bytes, secrets: Iterable[str]) -> str:
    """A short, single-line error message from a JSON error body ({"error": ...} / {"message": ...}), or ""."""
    try:
        obj = json.loads(body[:20_000])
    except (ValueError, UnicodeDecodeError):
        return ""
    msg = obj.get("error") or obj.get("message") or obj.get("detail") if isinstance(obj, dict) else None
    if isinstance(msg, dict):
        msg = msg.get("message")
    if not isinstance(msg, str):
        return ""
    return _redact(" ".join(msg.split())[:200], secrets)


async def _read_capped(response: httpx.Response, max_bytes: int) -> bytes | None:
    """The decoded body, or None when it exceeds `max_bytes` (counted as it streams, so a huge body is never held)."""
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > max_bytes:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def request_json(
    tool: str,
    method: str,
    url: str,
    *,
    timeout_s: float,
    params: Mapping[str, str | int] | None = None,
    json_body: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
    secrets: Iterable[str] = (),
) -> Any:
    """Call a configured search API and return its JSON body.

    The endpoint is configuration, not model input, so it does not go through `check_url`. Secrets belong in
    `headers` only; they are also listed in `secrets` so that no error text can echo them.

    Raises:
        SearchError: timeout, connection failure, error status, oversized or non-JSON body (message safe to show).
    """
    secrets = tuple(secrets)
    all_headers = {"User-Agent": USER_AGENT, "Accept": "application/json", **(headers or {})}
    try:
        async with asyncio.timeout(timeout_s), httpx.AsyncClient(timeout=timeout_s) as client:
            request = client.build_request(method, url, params=params, json=json_body, headers=all_headers)
            response = await client.send(request, stream=True)
            try:
                body = await _read_capped(response, API_MAX_BYTES)
            finally:
                await response.aclose()
    except (TimeoutError, httpx.TimeoutException) as exc:
        raise SearchError(f"{tool}: the search service timed out after {timeout_s:g} s") from exc
    except httpx.HTTPError as exc:
        raise SearchError(f"{tool}: could not reach the search service ({type(exc).__name__})") from exc
    status = response.status_code
    if status == 429:
        raise ServiceStatusError(
            f"{tool}: the search service is rate-limiting requests (HTTP 429); try again later", status
        )
    if status >= 400:
        detail = _error_detail(body or b"", secrets)
        message = f"{tool}: the search service answered HTTP {status}" + (f": {detail}" if detail else "")
        raise ServiceStatusError(message, status)
    if body is None:
        raise SearchError(f"{tool}: the search service sent more than {API_MAX_BYTES:,} bytes")
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SearchError(f"{tool}: the search service returned a body that is not JSON") from exc


def clip(text: str, max_chars: int) -> str:
    """Collapse whitespace and cut to `max_chars` characters at a word boundary, marking the cut with an ellipsis."""
    text = " ".join(text.split())
    if len(text) <= max_chars:
        return text
    cut = text[: max_chars - 1]
    space = cut.rfind(" ")
    if space > max_chars // 2:
        cut = cut[:space]
    return cut.rstrip() + "…"


# ---- guarded page fetching ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FetchedPage:
    """A fetched web page: the final URL after redirects and the (size-capped) body."""

    url: str
    status: int
    content_type: str
    body: bytes
    encoding: str | None


class WebPageFetcher:
    """Fetch pages for browse_webpage behind the SSRF guard, with redirect, size and time caps."""

    def __init__(
        self,
        *,
        timeout_s: float = 20.0,
        max_bytes: int = 2_000_000,
        max_redirects: int = 5,
        allow_hosts: frozenset[str] = frozenset(),
    ) -> None:
        """Configure the caps.

        Args:
            timeout_s: wall-clock limit of one fetch, all redirect hops included.
            max_bytes: largest body accepted (decoded size, counted while streaming).
            max_redirects: redirect hops followed before giving up.
            allow_hosts: hostnames exempt from the address check. For tests against 127.0.0.1 only; leave empty
                in production. Redirect targets are checked against it like any other URL.
        """
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.max_redirects = max_redirects
        self.allow_hosts = frozenset(h.lower() for h in allow_hosts)

    async def fetch(self, url: str) -> FetchedPage:
        """GET `url`, following redirects by hand so that every hop is checked.

        Raises:
            UnsafeURLError: a hop is refused by the guard, too many redirects, or the body is too large.
            SearchError: timeout, connection failure, error status or unsupported content type.
        """
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._follow(url)
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise SearchError(f"browse_webpage: the page did not load within {self.timeout_s:g} s") from exc
        except httpx.HTTPError as exc:
            raise SearchError(f"browse_webpage: could not fetch the page ({type(exc).__name__})") from exc

    async def _follow(self, url: str) -> FetchedPage:
        current: str | httpx.URL = url
        # trust_env=False: an environment proxy would connect on our behalf to an address we never checked.
        # No keep-alive: pooled connections are keyed by IP, so a TLS session verified for one hostname could
        # otherwise be reused for another hostname on the same address.
        no_reuse = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(
            timeout=self.timeout_s, trust_env=False, follow_redirects=False, limits=no_reuse
        ) as client:
            for _hop in range(self.max_redirects + 1):
                checked = await asyncio.to_thread(resolve_and_check, current, self.allow_hosts)
                response = await self._send_pinned(client, checked)
                try:
                    location = response.headers.get("location")
                    if response.status_code in REDIRECT_STATUSES and location:
                        try:
                            current = checked.url.join(location)
                        except httpx.InvalidURL as exc:
                            raise UnsafeURLError("refused: the page redirects to an invalid URL") from exc
                        continue
                    return await self._page(checked, response)
                finally:
                    await response.aclose()
        raise UnsafeURLError(f"refused: more than {self.max_redirects} redirects")

    async def _send_pinned(self, client: httpx.AsyncClient, checked: CheckedURL) -> httpx.Response:
        """Send the GET to each checked address in turn (as a resolver's caller would) until one connects."""
        error: httpx.ConnectError | None = None
        for address in checked.addresses:
            try:
                return await client.send(self._pinned_request(client, checked, address), stream=True)
            except httpx.ConnectError as exc:  # e.g. "localhost" -> ::1 first, but the server listens on IPv4 only
                error = exc
        if error is None:  # unreachable: resolve_and_check never returns an empty address list
            raise SearchError("browse_webpage: the host has no address")
        raise error

    @staticmethod
    def _pinned_request(client: httpx.AsyncClient, checked: CheckedURL, address: str) -> httpx.Request:
        """A GET to a checked address itself, naming the host in Host and (for https) SNI and certificate checks."""
        url = checked.url
        host = f"[{checked.host}]" if ":" in checked.host else checked.host  # an IPv6 literal needs brackets
        default_port = 443 if url.scheme == "https" else 80
        host_header = host if checked.port == default_port else f"{host}:{checked.port}"
        extensions: dict[str, Any] = {}
        if url.scheme == "https" and _literal_address(checked.host) is None:
            extensions["sni_hostname"] = checked.host  # TLS verifies the certificate against this name
        headers = {"Host": host_header, "User-Agent": USER_AGENT, "Accept": "text/html,text/plain;q=0.9,*/*;q=0.1"}
        return client.build_request("GET", url.copy_with(host=address), headers=headers, extensions=extensions)

    async def _page(self, checked: CheckedURL, response: httpx.Response) -> FetchedPage:
        status = response.status_code
        if status in REDIRECT_STATUSES:
            raise SearchError(f"browse_webpage: HTTP {status} redirect without a Location header")
        if status >= 400:
            raise SearchError(f"browse_webpage: the page answered HTTP {status}")
        content_type = response.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if content_type and content_type not in PAGE_CONTENT_TYPES:
            raise SearchError(f"browse_webpage: cannot read content of type {content_type!r} (HTML and text only)")
        try:
            body = await _read_capped(response, self.max_bytes)
        except httpx.HTTPError as exc:
            raise SearchError(f"browse_webpage: the download failed ({type(exc).__name__})") from exc
        if body is None:
            raise UnsafeURLError(f"refused: the page is larger than {self.max_bytes:,} bytes")
        return FetchedPage(
            url=str(checked.url),
            status=status,
            content_type=content_type or "text/html",
            body=body,
            encoding=response.charset_encoding,
        )


MAX_QUERY_CHARS = 2000


def require_query(tool: str, query: str) -> str:
    """The stripped query, or a SearchError the model can act on when it is empty or absurdly long."""
    query = " ".join(query.split())
    if not query:
        raise SearchError(f"{tool}: the query is empty; put the search text between the call_tool tags")
    if len(query) > MAX_QUERY_CHARS:
        raise SearchError(f"{tool}: the query is too long ({len(query)} characters; at most {MAX_QUERY_CHARS})")
    return query
