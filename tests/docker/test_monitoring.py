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

from tests.docker.test_compose import COMPOSE, DOCKER, argv, flags, interpolate, mounts, settings_for

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


@pytest.mark.may_skip("promtool comes with Debian's `prometheus` package, which CI machines need not have; the "
                      "config and the queries' metric names are checked above without it")
def test_promtool_accepts_the_scrape_config_and_every_dashboard_query(dashboard: dict[str, Any],
                                                                     tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (apt-get install prometheus)")
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
