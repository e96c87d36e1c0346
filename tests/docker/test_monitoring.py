"""The monitoring half of docker/ (issue 36): Prometheus's scrape config, Grafana's provisioning and the rubricem
dashboard agree with the code and with compose.yaml.

The dashboard cannot drift from the code: every metric name its PromQL uses must be one the running code exposes
(read from the live registry: agent.telemetry's instruments and app.metrics' store collector), and every rubricem
metric family the code defines has a panel. `promtool` (Debian's `prometheus` package) checks the scrape config and
every query's syntax where it is installed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.docker.test_compose import (
    COMPOSE,
    DOCKER,
    INTERPOLATION,
    argv,
    environment,
    flags,
    interpolate,
    mounts,
    settings_for,
)

DASHBOARD = DOCKER / "grafana" / "dashboards" / "rubricem.json"
DATASOURCES = DOCKER / "grafana" / "provisioning" / "datasources" / "prometheus.yaml"
PROVIDERS = DOCKER / "grafana" / "provisioning" / "dashboards" / "rubricem.yaml"
PROMETHEUS = DOCKER / "prometheus.yml"
METRIC = re.compile(r"\brubricem_[a-z0-9_]+\b")
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__range": "1h", "$__interval": "15s"}


def exposed_names(registry: Any) -> tuple[set[str], set[str]]:
    """(sample names a scrape can contain, family names) of the registry's rubricem families, from each family's
    type: a family with no samples yet (a labelled histogram before its first call) counts too."""
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
                "gauge": ("",), "info": ("_info",), "summary": ("", "_count", "_sum", "_created")}
    names: set[str] = set()
    families: set[str] = set()
    for family in registry.collect():
        if family.name.startswith("rubricem_"):
            families.add(family.name)
            names.update(family.name + suffix for suffix in suffixes[family.type])
    return names, families


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target."""
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def test_the_dashboard_uses_only_metrics_the_code_defines_and_has_a_panel_for_each(
    dashboard: dict[str, Any], tmp_path: Path
) -> None:
    from app.metrics import metrics_registry
    from store.session_log import SessionLog

    with SessionLog(tmp_path / "s.db") as log:
        names, families = exposed_names(metrics_registry(log))
    # what the issue asks the metrics to cover is really defined (the derivation itself works)
    assert {"rubricem_store_sessions", "rubricem_stage_seconds", "rubricem_tool_seconds", "rubricem_tool_errors",
            "rubricem_judge_call_seconds", "rubricem_judge_failures", "rubricem_store_retrain_cycles",
            "rubricem_live_policy", "rubricem_policy_tokens", "rubricem_judge_tokens"} <= families
    used: set[str] = set()
    for title, expr in queries(dashboard):
        found = set(METRIC.findall(expr))
        assert found, f"panel {title!r}: {expr!r} uses no rubricem metric"
        assert found <= names, f"panel {title!r} uses metrics the code does not define: {sorted(found - names)}"
        used |= found
    covered = {f for f in families if any(n == f or n.startswith(f + "_") for n in used)}
    assert covered == families, f"metrics without a panel: {sorted(families - covered)}"


def test_every_panel_queries_the_provisioned_prometheus_and_fits_the_grid(dashboard: dict[str, Any]) -> None:
    sources = yaml.safe_load(DATASOURCES.read_text(encoding="utf-8"))
    assert sources["apiVersion"] == 1
    (source,) = sources["datasources"]
    assert source["type"] == "prometheus" and source["access"] == "proxy" and source["isDefault"] is True
    expected = {"type": "prometheus", "uid": source["uid"]}
    assert dashboard["uid"] and dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for p in panels:
        pos = p["gridPos"]
        assert pos["x"] >= 0 and pos["w"] >= 1 and pos["x"] + pos["w"] <= 24 and pos["h"] >= 1, p["title"]
        assert p["datasource"] == expected, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(set(refs)) == len(refs), p["title"]
        assert all(t["datasource"] == expected for t in p["targets"]), p["title"]
    cells = [(x, y) for p in panels for x in range(p["gridPos"]["x"], p["gridPos"]["x"] + p["gridPos"]["w"])
             for y in range(p["gridPos"]["y"], p["gridPos"]["y"] + p["gridPos"]["h"])]
    assert len(cells) == len(set(cells)), "panels overlap"


def test_compose_wires_prometheus_to_the_scheduler_and_grafana_to_prometheus(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    services = compose["services"]
    prom, grafana = services["prometheus"], services["grafana"]
    scrape = yaml.safe_load(PROMETHEUS.read_text(encoding="utf-8"))
    jobs = {job["job_name"]: job for job in scrape["scrape_configs"]}

    # Prometheus reads the mounted file and reaches the scheduler's endpoint, in either stack.
    config = flags(argv(prom["command"]))["--config.file"]
    assert any(m.source == "./prometheus.yml" and m.target == config and m.read_only for m in mounts(prom))
    (sd,) = jobs["rubricem-scheduler"]["dns_sd_configs"]
    assert set(sd["names"]) == {"scheduler", "scheduler-replicas"} <= set(services) and sd["type"] == "A"
    for name in sd["names"]:
        telemetry = settings_for(name, compose, monkeypatch).telemetry
        assert telemetry.metrics_port == sd["port"] and telemetry.metrics_host == "0.0.0.0", name
        assert set(services[name]["networks"]) & set(prom["networks"]), name
    (vllm_sd,) = jobs["vllm"]["dns_sd_configs"]
    assert {n for n in vllm_sd["names"]} <= set(services)
    assert all(f"--port={vllm_sd['port']}" in argv(services[n]["command"]) for n in vllm_sd["names"])

    # Grafana: the provisioning folder where Grafana looks, the dashboards where the provider looks, and the data
    # source at the prometheus service's port.
    targets = {m.target: m for m in mounts(grafana)}
    assert targets["/etc/grafana/provisioning"].source == "./grafana/provisioning"
    (provider,) = yaml.safe_load(PROVIDERS.read_text(encoding="utf-8"))["providers"]
    folder = provider["options"]["path"]
    assert targets[folder].source == "./grafana/dashboards" and targets[folder].read_only
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{folder}/{DASHBOARD.name}"
    (source,) = yaml.safe_load(DATASOURCES.read_text(encoding="utf-8"))["datasources"]
    assert source["url"] == "http://prometheus:9090"
    assert "127.0.0.1:9090/-/ready" in " ".join(prom["healthcheck"]["test"])
    assert set(grafana["networks"]) & set(prom["networks"])
    # Grafana (a web UI with its own users) never joins the network vLLM's admin routes are on, and its port is
    # published on loopback only.
    assert "internal" not in grafana["networks"] and compose["networks"]["internal"]["internal"] is True
    assert all(interpolate(p).startswith("127.0.0.1:") for p in grafana["ports"])
    assert grafana["depends_on"] == {"prometheus": {"condition": "service_healthy"}}


def test_promtool_accepts_the_scrape_config_and_every_dashboard_query(dashboard: dict[str, Any],
                                                                     tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed: `make install` installs Debian's prometheus package as root "
                    "(apt-get install prometheus)")
    p = subprocess.run([promtool, "check", "config", "--syntax-only", str(PROMETHEUS)], capture_output=True,
                       text=True, check=False, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    rules = []
    for i, (_title, expr) in enumerate(queries(dashboard)):
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}), encoding="utf-8")
    p = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False,
                       timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


# ---- issue 46, item 8: the monitoring defaults ---------------------------------------------------------------------

GRAFANA_IMAGE_ENTRYPOINT = ["/run.sh"]  # grafana/grafana's Dockerfile: ENTRYPOINT [ "/run.sh" ]


def _resolve(text: str, shell_env: dict[str, str]) -> str:
    """Compose's interpolation of `text` with `shell_env` as the shell's (or --env-file's) variables."""
    def repl(m: re.Match[str]) -> str:
        value = shell_env.get(m.group(1))
        if m.group(2) == ":-" and not value or m.group(2) == "-" and value is None:
            return m.group(3)
        return value or ""

    return INTERPOLATION.sub(repl, text).replace("$$", "$")


def _start_grafana(grafana: dict[str, Any], password: str | None, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """What `docker compose up grafana` runs, with GRAFANA_ADMIN_PASSWORD set to `password` (None: unset): the
    service's entrypoint and command (the image's when absent) in the container's environment, here with /bin/sh,
    and a stand-in for the image's /run.sh (Grafana itself) that only says it started."""
    shell_env = {} if password is None else {"GRAFANA_ADMIN_PASSWORD": password}
    env = {name: _resolve(value, shell_env) for name, value in environment(grafana).items()}
    started = tmp_path / "run.sh"
    started.write_text("#!/bin/sh\necho grafana started\n", encoding="utf-8")
    started.chmod(0o700)
    entry = [_resolve(a, shell_env) for a in argv(grafana.get("entrypoint") or GRAFANA_IMAGE_ENTRYPOINT)]
    command = [_resolve(a, shell_env) for a in argv(grafana.get("command") or [])]
    cmd = [str(started) if a == "/run.sh" else a for a in entry + command]
    return subprocess.run(cmd, env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True, timeout=30,
                          check=False)


@pytest.mark.parametrize("password", [None, "", "admin", "short-pw"])
def test_grafana_refuses_to_start_without_a_real_admin_password(
        compose: dict[str, Any], password: str | None, tmp_path: Path) -> None:
    """Grafana falls back to admin/admin when GF_SECURITY_ADMIN_PASSWORD is empty: the service must not start."""
    p = _start_grafana(compose["services"]["grafana"], password, tmp_path)
    assert "grafana started" not in p.stdout and p.returncode != 0, p.stdout + p.stderr
    assert "GRAFANA_ADMIN_PASSWORD" in p.stderr
    assert password in (None, "", "admin") or password not in p.stderr  # never echoed


def test_grafana_starts_with_a_set_admin_password(compose: dict[str, Any], tmp_path: Path) -> None:
    p = _start_grafana(compose["services"]["grafana"], "a-long-grafana-password-7", tmp_path)
    assert p.returncode == 0 and p.stdout.strip() == "grafana started", p.stdout + p.stderr


def test_prometheus_scrapes_the_scheduler_by_a_host_name_its_endpoint_answers(
        compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler's /metrics answers only its own Host names; Prometheus's DNS discovery would send the container's
    address as Host, so the scrape config relabels the address to the service name, and compose lists that name."""
    from app.hostcheck import host_rule

    scrape = yaml.safe_load(PROMETHEUS.read_text(encoding="utf-8"))
    job = next(j for j in scrape["scrape_configs"] if j["job_name"] == "rubricem-scheduler")
    (sd,) = job["dns_sd_configs"]
    relabel = [r for r in job.get("relabel_configs", []) if r.get("target_label") == "__address__"]
    assert len(relabel) == 1 and relabel[0]["source_labels"] == ["__meta_dns_name"], \
        "Prometheus would scrape the scheduler by its container address, which no Host check can know"
    for name in sd["names"]:
        match = re.fullmatch(relabel[0].get("regex", "(.*)"), name)
        assert match is not None, name
        address = match.expand(relabel[0]["replacement"].replace("$1", r"\1"))
        telemetry = settings_for(name, compose, monkeypatch).telemetry
        rule = host_rule(telemetry.metrics_host, telemetry.metrics_port, telemetry.metrics_allowed_hosts,
                         who=name, setting="RUBRICEM_TELEMETRY__METRICS_ALLOWED_HOSTS")
        assert rule.refusal(address, None) is None, (name, address, rule.hosts)
        assert rule.refusal(f"rebound.example:{sd['port']}", None) is not None
