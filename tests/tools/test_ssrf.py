"""The SSRF guard: check_url on address forms, and WebPageFetcher re-checking redirects against a real server."""

from __future__ import annotations

import asyncio
import ipaddress
import threading

import pytest
from tools_support import LocalServer, Reply

from agent.errors import SearchError, ToolError, UnsafeURLError
from agent.tools.web import WebPageFetcher, address_refusal, check_url, resolve_and_check

REFUSED = [
    "http://127.0.0.1/",
    "http://127.0.0.1:8080/admin",
    "http://localhost/",
    "http://LOCALHOST:9000/",
    "http://foo.localhost/",
    "http://10.0.0.1/",
    "http://10.255.255.255/x",
    "http://172.16.0.1/",
    "http://172.31.255.254/",
    "http://192.168.1.1/",
    "http://169.254.169.254/latest/meta-data/",
    "http://169.254.1.1/",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://metadata.google.internal./computeMetadata/v1/",
    "http://[fd00:ec2::254]/latest/meta-data/",
    "http://100.64.0.1/",  # CGNAT
    "http://100.100.100.200/",  # Alibaba metadata, inside CGNAT
    "http://0.0.0.0/",
    "http://[::]/",
    "http://[::1]/",
    "http://[::1]:8000/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:7f00:1]/",
    "http://[::ffff:10.0.0.1]/",
    "http://[::ffff:169.254.169.254]/",
    "http://[64:ff9b::a00:1]/",  # NAT64 form of 10.0.0.1
    "http://[2002:7f00:1::]/",  # 6to4 form of 127.0.0.1
    "http://[fe80::1]/",
    "http://[fc00::1]/",
    "http://224.0.0.1/",
    "http://[ff02::1]/",
    "http://240.0.0.1/",  # reserved
    "http://255.255.255.255/",
    "http://198.18.0.1/",  # benchmarking range
    "http://2130706433/",  # decimal 127.0.0.1
    "http://0x7f000001/",  # hex
    "http://0x7f.0.0.1/",
    "http://0177.0.0.1/",  # octal
    "http://127.1/",  # short form
    "http://017700000001/",
    "file:///etc/passwd",
    "ftp://example.com/file",
    "gopher://127.0.0.1:70/",
    "javascript:alert(1)",
    "data:text/html,hi",
    "http://user:secret@93.184.215.14/",
    "//93.184.215.14/",
    "not a url",
    "",
    "http://nonexistent.invalid/",
]


@pytest.mark.parametrize("url", REFUSED)
def test_check_url_refuses_non_public_and_non_http(url: str) -> None:
    with pytest.raises(UnsafeURLError) as info:
        check_url(url)
    assert isinstance(info.value, ToolError)  # the graph shows it to the model
    assert str(info.value).startswith("refused:")


@pytest.mark.parametrize(
    "url",
    [
        "http://93.184.215.14/",
        "https://8.8.8.8/dns-query",
        "http://1.1.1.1:8080/path?q=1",
        "https://[2606:4700:4700::1111]/",
        "http://[::ffff:8.8.8.8]/",  # mapped form of a public address is that public address
    ],
)
def test_check_url_allows_public_addresses(url: str) -> None:
    check_url(url)


def test_mapped_public_address_connects_over_ipv4() -> None:
    assert resolve_and_check("http://[::ffff:8.8.8.8]/").addresses == ("8.8.8.8",)


@pytest.mark.parametrize(
    ("addr", "reason"),
    [
        ("127.0.0.1", "a loopback address"),
        ("10.1.2.3", "a private address"),
        ("::1", "a loopback address"),
        ("::ffff:192.168.0.1", "a private address"),  # judged as the IPv4 address it maps
        ("169.254.169.254", "a cloud metadata address"),
        ("169.254.1.1", "a link-local address"),
        ("100.64.3.4", "a shared or reserved address"),
        ("224.0.0.1", "a multicast address"),
        ("0.0.0.0", "an unspecified address"),
        ("8.8.8.8", None),
    ],
)
def test_address_refusal_names_the_reason(addr: str, reason: str | None) -> None:
    assert address_refusal(ipaddress.ip_address(addr)) == reason


def test_allow_hosts_exempts_only_the_named_host() -> None:
    resolve_and_check("http://127.0.0.1:1/", allow_hosts=frozenset({"127.0.0.1"}))
    with pytest.raises(UnsafeURLError):
        resolve_and_check("http://localhost:1/", allow_hosts=frozenset({"127.0.0.1"}))
    with pytest.raises(UnsafeURLError):
        resolve_and_check("http://10.0.0.1/", allow_hosts=frozenset({"127.0.0.1"}))


def _fetcher(**kw: object) -> WebPageFetcher:
    opts: dict[str, object] = {"timeout_s": 5.0, "max_bytes": 100_000, "max_redirects": 3}
    opts.update(kw)
    return WebPageFetcher(allow_hosts=frozenset({"127.0.0.1"}), **opts)  # type: ignore[arg-type]


def test_fetcher_refuses_loopback_without_allow_hosts(server: LocalServer) -> None:
    server.route("/page", Reply.html("<p>secret</p>"))
    with pytest.raises(UnsafeURLError):
        asyncio.run(WebPageFetcher().fetch(f"{server.root}/page"))
    assert server.requests == []  # refused before any connection


@pytest.mark.parametrize(
    "target",
    [
        "http://10.0.0.1/secret",
        "http://169.254.169.254/latest/meta-data/iam/",
        "http://[::1]/",
        "http://2130706433/",
        "http://metadata.google.internal/",
        "file:///etc/passwd",
    ],
)
def test_redirect_to_private_after_allowed_hop_is_refused(server: LocalServer, target: str) -> None:
    server.route("/start", Reply(302, headers={"Location": target, "Content-Length": "0"}))
    with pytest.raises(UnsafeURLError):
        asyncio.run(_fetcher().fetch(f"{server.root}/start"))
    assert [r.path for r in server.requests] == ["/start"]


def test_redirect_to_localhost_name_is_refused_even_on_same_server(server: LocalServer) -> None:
    server.route("/start", Reply(301, headers={"Location": f"http://localhost:{server.port}/page"}))
    server.route("/page", Reply.html("<p>internal</p>"))
    with pytest.raises(UnsafeURLError):
        asyncio.run(_fetcher().fetch(f"{server.root}/start"))
    assert [r.path for r in server.requests] == ["/start"]


def test_redirects_are_followed_when_every_hop_passes(server: LocalServer) -> None:
    server.route("/a", Reply(302, headers={"Location": "/b"}))
    server.route("/b", Reply(307, headers={"Location": f"{server.root}/c"}))
    server.route("/c", Reply.html("<html><body><p>arrived</p></body></html>"))
    page = asyncio.run(_fetcher().fetch(f"{server.root}/a"))
    assert page.url == f"{server.root}/c"
    assert b"arrived" in page.body
    assert [r.path for r in server.requests] == ["/a", "/b", "/c"]


def test_redirect_cap(server: LocalServer) -> None:
    server.route("/loop", Reply(302, headers={"Location": "/loop"}))
    with pytest.raises(UnsafeURLError, match="redirects"):
        asyncio.run(_fetcher(max_redirects=2).fetch(f"{server.root}/loop"))
    assert len(server.requests) == 3  # the first request and two redirects


def test_connection_goes_to_checked_address_with_original_host_header(server: LocalServer) -> None:
    """A name is resolved once, checked (exempt here), and the request goes to that IP with Host preserved."""
    server.route("/echo", Reply.html("<p>ok</p>"))
    fetcher = WebPageFetcher(allow_hosts=frozenset({"localhost"}), timeout_s=5.0)
    asyncio.run(fetcher.fetch(f"http://localhost:{server.port}/echo"))
    assert server.requests[-1].headers["host"] == f"localhost:{server.port}"


def test_size_cap_with_declared_length(server: LocalServer) -> None:
    server.route("/big", Reply(200, b"x" * 200_000, {"Content-Type": "text/html"}))
    with pytest.raises(UnsafeURLError, match="larger than"):
        asyncio.run(_fetcher().fetch(f"{server.root}/big"))


def test_size_cap_while_streaming_without_length(server: LocalServer) -> None:
    endless = (b"<p>" + b"y" * 8192 + b"</p>" for _ in range(10_000))  # ~80 MB if read to the end
    server.route("/stream", Reply(200, headers={"Content-Type": "text/html"}, chunks=endless))
    with pytest.raises(UnsafeURLError, match="larger than"):
        asyncio.run(_fetcher().fetch(f"{server.root}/stream"))


def test_time_cap_on_a_slow_server(server: LocalServer) -> None:
    answer = threading.Event()  # the server answers only after the test: the fetcher's time cap is certain to fire
    server.route("/slow", Reply(200, b"<p>late</p>", {"Content-Type": "text/html"}, hold=answer))
    try:
        with pytest.raises(SearchError, match="did not load"):
            asyncio.run(_fetcher(timeout_s=0.5).fetch(f"{server.root}/slow"))
    finally:
        answer.set()


def test_time_cap_covers_a_dripping_body(server: LocalServer) -> None:
    drip = (b"<p>.</p>" for _ in range(100))
    server.route("/drip", Reply(200, headers={"Content-Type": "text/html"}, chunks=drip, chunk_delay_s=0.2))
    with pytest.raises(SearchError, match="did not load"):
        asyncio.run(_fetcher(timeout_s=1.0).fetch(f"{server.root}/drip"))
