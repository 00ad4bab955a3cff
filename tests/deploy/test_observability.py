"""Prometheus scrapes every service; Grafana is provisioned as code; dashboards query real names.

The static half: every metric a dashboard queries is one of the names fixed by the team
conventions (so a typo fails here with no service running). The live half, which scrapes
the running services, is test_metrics_live.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml
from deploy_support import (
    ALERTS,
    COMPOSE,
    DASHBOARDS,
    DEPLOY,
    KNOWN_METRICS,
    PROMETHEUS_SERIES,
    alert_exprs,
    dashboard_exprs,
    dashboard_files,
    dashboard_metrics,
    owner,
    promql_metrics,
    queried_metrics,
)

PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
PROVISIONING = DEPLOY / "grafana" / "provisioning"
# Every /metrics endpoint of the stack: compose service (or alias) and port.
SCRAPED = {
    "tts": "tts:8001",
    "llm": "llm:8002",
    "agent": "agent:8003",
    "token": "token:8080",
    "dcgm": "dcgm-exporter:9400",
    "livekit": "livekit:6789",
}


def test_prometheus_scrapes_every_service():
    cfg = yaml.safe_load(PROMETHEUS.read_text())
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    for job, target in SCRAPED.items():
        assert job in jobs, f"no scrape job {job}"
        targets = [t for sc in jobs[job]["static_configs"] for t in sc["targets"]]
        assert target in targets, f"job {job} scrapes {targets}, expected {target}"
        assert jobs[job].get("metrics_path", "/metrics") == "/metrics"
    # Targets are compose names: each resolves to a service or a network alias.
    compose = yaml.safe_load(COMPOSE.read_text())["services"]
    names = set(compose)
    for svc in compose.values():
        nets = svc.get("networks") or {}
        if isinstance(nets, dict):
            for net in nets.values():
                names |= set((net or {}).get("aliases", []))
    for job, target in SCRAPED.items():
        assert target.split(":")[0] in names, f"{job}: {target} is no compose service"
    # The compose file mounts this config where the prometheus image reads it.
    prom = compose["prometheus"]
    assert any(v.startswith("./deploy/prometheus/prometheus.yml:") for v in prom["volumes"])


def test_livekit_exports_prometheus_on_the_scraped_port():
    lk = yaml.safe_load((DEPLOY / "livekit" / "livekit.yaml").read_text())
    assert f"livekit:{lk['prometheus_port']}" == SCRAPED["livekit"]


def test_grafana_datasource_and_dashboards_are_provisioned():
    ds = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())
    [source] = ds["datasources"]
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "voice.yaml").read_text())
    [provider] = providers["providers"]
    path = provider["options"]["path"]
    grafana = yaml.safe_load(COMPOSE.read_text())["services"]["grafana"]
    mounts = dict(v.split(":")[:2] for v in grafana["volumes"])
    assert mounts["./deploy/grafana/dashboards"] == path, "provider path is not the mount"
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    files = dashboard_files()
    assert files, f"no dashboards in {DASHBOARDS}"
    for f in files:
        dash = json.loads(f.read_text())
        assert dash["uid"] and dash["title"]
        for title, _ in dashboard_exprs(f):
            panel = next(p for p in dash["panels"] if p.get("title") == title)
            assert panel["datasource"]["uid"] == source["uid"], f"{title}: unknown datasource"


def test_dashboard_json_is_what_the_code_renders():
    script = DEPLOY / "grafana" / "build_dashboard.py"
    proc = subprocess.run([sys.executable, str(script), "--check"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_dashboard_panels_cover_the_issue():
    used = dashboard_metrics()
    wanted = {
        "tts_ttfa_seconds", "tts_rtf", "tts_active_sessions", "tts_frames_sent_total",
        "tts_engine_step_seconds", "tts_engine_batch_size", "llm_ttft_seconds",
        "llm_generated_tokens_total", "agent_eot_to_first_audio_seconds",
        "agent_cancel_to_silence_seconds", "tts_errors_total", "llm_errors_total",
        "agent_errors_total", "DCGM_FI_DEV_GPU_UTIL",
    }
    assert not wanted - set(used), f"no panel for {sorted(wanted - set(used))}"
    exprs = [e for f in dashboard_files() for _, e in dashboard_exprs(f)]
    for q in ("0.5", "0.95", "0.99"):
        assert any(f"histogram_quantile({q}" in e and "tts_ttfa_seconds" in e for e in exprs)
    for metric, label in (("tts_errors_total", "code"), ("llm_errors_total", "code"),
                          ("agent_errors_total", "component")):
        assert any(metric in e and f"by ({label})" in e for e in exprs), f"{metric} by {label}"


def test_every_dashboard_metric_is_a_known_name():
    """Static: a misspelt metric in a dashboard fails here, services or not."""
    used = dashboard_metrics()
    assert used, "no metrics found in the dashboards: the PromQL parser is broken"
    unknown = {m: sorted(files) for m, files in used.items() if m not in KNOWN_METRICS}
    assert not unknown, f"dashboard metrics not in the conventions' list: {unknown}"


def test_alert_rules_load_and_query_known_metrics():
    cfg = yaml.safe_load(PROMETHEUS.read_text())
    assert cfg["rule_files"] == ["/etc/prometheus/alerts.yml"]
    prom = yaml.safe_load(COMPOSE.read_text())["services"]["prometheus"]
    assert f"./deploy/prometheus/{ALERTS.name}:/etc/prometheus/alerts.yml:ro" in prom["volumes"]
    doc = yaml.safe_load(ALERTS.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
            assert rule["labels"]["severity"] in ("page", "ticket")
    alerts = dict(alert_exprs())
    assert "0.65" in alerts["EotToFirstAudioP95High"], "the 650 ms gate"
    used = set().union(*(promql_metrics(e) for e in alerts.values())) - PROMETHEUS_SERIES
    assert used and used <= KNOWN_METRICS, sorted(used - KNOWN_METRICS)
    assert set(queried_metrics()) >= used


def test_promtool_accepts_the_config_and_the_alerts_fire_as_tested(tmp_path):
    """The real Prometheus tooling, when installed (Debian package `prometheus`)."""
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    # The config names the rules by their path in the container: point it at the copy.
    shutil.copy(ALERTS, tmp_path / ALERTS.name)
    (tmp_path / "prometheus.yml").write_text(
        PROMETHEUS.read_text().replace("/etc/prometheus/alerts.yml", ALERTS.name))
    for args in (["check", "config", "prometheus.yml"], ["check", "rules", ALERTS.name]):
        proc = subprocess.run([promtool, *args], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    # Alert unit tests: the gate alert fires after 5 min over 650 ms and not below it, etc.
    proc = subprocess.run([promtool, "test", "rules", "alerts_test.yml"],
                          cwd=ALERTS.parent, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- the PromQL parser the two checks above rely on -----------------------------------------


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("histogram_quantile(0.95, sum by (le) (rate(tts_ttfa_seconds_bucket[$__rate_interval])))",
         {"tts_ttfa_seconds"}),
        ('sum by (code) (rate(tts_errors_total{code!="OK", job=~"tts.*"}[5m]))',
         {"tts_errors_total"}),
        ("sum(rate(a_sum[1m])) / sum(rate(a_count[1m])) > bool 0.5", {"a"}),
        ("DCGM_FI_DEV_GPU_UTIL", {"DCGM_FI_DEV_GPU_UTIL"}),
        ("max without (instance) (x) or on (job) y offset 5m", {"x", "y"}),
        ("sum(tts_active_sessions) by (instance) * 1e3", {"tts_active_sessions"}),
        ('label_replace(up, "a", "$1", "job", "(.*)")', {"up"}),
        ("rate(x[5m:30s]) + $var", {"x"}),
    ],
)
def test_promql_metric_names(expr, names):
    assert promql_metrics(expr) == names


def test_every_service_has_panels():
    owners = {owner(m) for m in dashboard_metrics()}
    assert {"tts", "llm", "agent", "token", "dcgm-exporter"} <= owners
