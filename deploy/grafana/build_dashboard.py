"""Builds deploy/grafana/dashboards/voice.json, the stack's one dashboard, from this file.

Dashboards as code: panels are declared here in a few lines each and rendered to the
JSON Grafana provisions; `python deploy/grafana/build_dashboard.py` rewrites the file and
tests/deploy checks that the committed JSON is what this script renders (so an edit made
in the Grafana UI and exported must come back here) and that every metric it queries is
one our services export.

Run with any Python 3.11 (standard library only).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

OUT = Path(__file__).parent / "dashboards" / "voice.json"
DATASOURCE = {"type": "prometheus", "uid": "prometheus"}
RATE = "$__rate_interval"


def quantiles(metric: str, qs: tuple[float, ...] = (0.5, 0.95, 0.99)) -> list[tuple[str, str]]:
    """P50/P95/P99 of a histogram over all instances."""
    return [
        (
            f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket[{RATE}])))",
            f"P{round(q * 100)}",
        )
        for q in qs
    ]


@dataclass
class Panel:
    title: str
    targets: list[tuple[str, str]]  # (PromQL, legend)
    unit: str = "short"
    description: str = ""
    kind: str = "timeseries"
    # (value, colour) steps after the base green, e.g. a latency gate.
    thresholds: list[tuple[float, str]] = field(default_factory=list)
    width: int = 8


ROWS: list[tuple[str, list[Panel]]] = [
    (
        "TTS",
        [
            Panel(
                "TTFA (server)",
                quantiles("tts_ttfa_seconds"),
                unit="s",
                description="First text (or FLUSH) in to first PCM frame out (design.md 6).",
            ),
            Panel(
                "RTF",
                quantiles("tts_rtf"),
                description="Synthesis wall time / audio duration per utterance; < 1 keeps up.",
                thresholds=[(1.0, "red")],
            ),
            Panel(
                "Active sessions",
                [("sum(tts_active_sessions)", "all"),
                 ("sum by (protocol) (tts_active_sessions)", "{{protocol}}")],
                description="Open calls: gRPC streams, HTTP speech responses, WebSockets.",
            ),
            Panel(
                "Calls/s by protocol",
                [(f"sum by (protocol) (rate(tts_requests_total[{RATE}]))", "{{protocol}}")],
                unit="reqps",
                description="Calls opened through gRPC, POST /v1/audio/speech and the "
                "speech WebSocket (admitted or not).",
            ),
            Panel(
                "Frames/s sent",
                [(f"sum(rate(tts_frames_sent_total[{RATE}]))", "frames/s")],
                unit="short",
                description="20 ms frames leaving the server: 50/s per speaking session.",
            ),
            Panel(
                "Engine step time",
                quantiles("tts_engine_step_seconds"),
                unit="s",
                description="One batched engine step (all sessions advance one codec frame).",
            ),
            Panel(
                "Engine batch size",
                [
                    *quantiles("tts_engine_batch_size", (0.5, 0.95)),
                    (
                        f"sum(rate(tts_engine_batch_size_sum[{RATE}]))"
                        f" / sum(rate(tts_engine_batch_size_count[{RATE}]))",
                        "mean",
                    ),
                ],
            ),
        ],
    ),
    (
        "Thinker",
        [
            Panel("TTFT", quantiles("llm_ttft_seconds"), unit="s"),
            Panel(
                "Tokens/s generated",
                [(f"sum(rate(llm_generated_tokens_total[{RATE}]))", "tokens/s")],
            ),
            Panel(
                "Requests in flight, aborts/s",
                [
                    ("sum(llm_active_requests)", "in flight"),
                    (f"sum(rate(llm_aborts_total[{RATE}]))", "aborts/s"),
                ],
            ),
        ],
    ),
    (
        "Agent",
        [
            Panel(
                "EoT → first audio",
                quantiles("agent_eot_to_first_audio_seconds"),
                unit="s",
                description="End of user speech to the first audible frame; gate P95 <= 650 ms.",
                thresholds=[(0.65, "red")],
            ),
            Panel(
                "Cancel → silence",
                quantiles("agent_cancel_to_silence_seconds"),
                unit="s",
                description="Barge-in (or STOP) to the last audio frame out.",
            ),
            Panel(
                "TTS first frame → publish",
                quantiles("agent_tts_first_to_publish_seconds", (0.5, 0.95)),
                unit="s",
                description="Gate: <= 120 ms.",
                thresholds=[(0.12, "red")],
            ),
            Panel(
                "EoT → first audio by stage (P95)",
                [
                    (
                        f"histogram_quantile(0.95, sum by (le) (rate({m}_bucket[{RATE}])))",
                        name,
                    )
                    for m, name in (
                        ("agent_eot_to_first_audio_seconds", "whole turn"),
                        ("agent_vad_lag_seconds", "VAD lag (past its hangover)"),
                        ("agent_eot_wait_seconds", "end-of-turn wait"),
                        ("agent_stt_seconds", "VAD end → transcript"),
                        ("agent_llm_ttft_seconds", "thinker TTFT"),
                        ("agent_tts_ttfa_seconds", "TTS TTFA"),
                        ("agent_tts_first_to_publish_seconds", "TTS frame → out"),
                    )
                ],
                unit="s",
                description="P95 of each stage the agent times. The end-of-turn wait: "
                "the last speech sample -> the turn's end decided (the VAD's hangover, "
                "AGENT_MIN_ENDPOINTING_DELAY_S, up to AGENT_MAX_ENDPOINTING_DELAY_S when the "
                "detector doubts); the thinker and the TTS start inside it.",
            ),
            Panel(
                "Conversations",
                [("sum(agent_conversations_active)", "all"),
                 ("sum by (instance) (agent_conversations_active)", "{{instance}}")],
                description="Conversations each agent process carries: /v1/talk, direct "
                "mode and LiveKit jobs.",
            ),
            Panel(
                "Calls refused/s by reason",
                [(f"sum by (reason) (rate(agent_ws_refused_total[{RATE}]))", "{{reason}}")],
                unit="reqps",
                description="/v1/talk refusals: busy (AGENT_WS_MAX_SESSIONS), overloaded "
                "(the process runs late: AGENT_ADMIT_MAX_LAG_MS), unauthorized, protocol "
                "errors.",
            ),
            Panel(
                "Event loop lag",
                quantiles("agent_loop_lag_seconds"),
                unit="s",
                description="How late the agent's event loop runs its timers (sampled "
                "every 50 ms). Past a frame or two (the 40 ms line) replies break up and "
                "/v1/talk refuses new calls.",
                thresholds=[(0.04, "red")],
            ),
            Panel(
                "Turns/s, interruptions/s, backchannels/s",
                [
                    (f"sum(rate(agent_turns_total[{RATE}]))", "turns/s"),
                    (f"sum(rate(agent_interruptions_total[{RATE}]))", "interruptions/s"),
                    (f"sum(rate(agent_backchannels_total[{RATE}]))", "backchannels/s"),
                ],
            ),
            Panel(
                "Token requests by status",
                [(f"sum by (status) (rate(token_requests_total[{RATE}]))", "{{status}}")],
                unit="reqps",
            ),
        ],
    ),
    (
        "Errors",
        [
            Panel(
                "TTS errors by code",
                [(f"sum by (code) (rate(tts_errors_total[{RATE}]))", "{{code}}")],
                unit="reqps",
            ),
            Panel(
                "Thinker errors by code",
                [(f"sum by (code) (rate(llm_errors_total[{RATE}]))", "{{code}}")],
                unit="reqps",
            ),
            Panel(
                "Agent errors by component",
                [(f"sum by (component) (rate(agent_errors_total[{RATE}]))", "{{component}}")],
                unit="reqps",
            ),
        ],
    ),
    (
        "GPU (dcgm-exporter)",
        [
            Panel(
                "GPU utilisation",
                [("DCGM_FI_DEV_GPU_UTIL", "GPU {{gpu}}")],
                unit="percent",
                width=12,
            ),
            Panel(
                "GPU memory used",
                [("DCGM_FI_DEV_FB_USED", "GPU {{gpu}}")],
                unit="decmbytes",
                width=12,
            ),
        ],
    ),
]


def render_panel(panel: Panel, pid: int, x: int, y: int) -> dict:
    steps = [{"color": "green", "value": None}]
    steps += [{"color": colour, "value": value} for value, colour in panel.thresholds]
    return {
        "id": pid,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {
            "defaults": {
                "unit": panel.unit,
                "thresholds": {"mode": "absolute", "steps": steps},
                "custom": {
                    "thresholdsStyle": {"mode": "line" if panel.thresholds else "off"}
                },
            },
            "overrides": [],
        },
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": DATASOURCE,
                "expr": expr,
                "legendFormat": legend,
            }
            for i, (expr, legend) in enumerate(panel.targets)
        ],
    }


def render() -> dict:
    panels: list[dict] = []
    pid, y = 1, 0
    for title, row in ROWS:
        panels.append(
            {"id": pid, "type": "row", "title": title, "collapsed": False,
             "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []}
        )
        pid, y, x = pid + 1, y + 1, 0
        for panel in row:
            if x + panel.width > 24:
                x, y = 0, y + 8
            panels.append(render_panel(panel, pid, x, y))
            pid, x = pid + 1, x + panel.width
        y += 8
    return {
        "uid": "voice-overview",
        "title": "Voice stack",
        "description": "TTS, thinker, agent, token service and GPU: latency, throughput, errors.",
        "tags": ["voice"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "5s",
        "time": {"from": "now-30m", "to": "now"},
        "editable": False,
        "templating": {"list": []},
        "annotations": {"list": []},
        "panels": panels,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=f"Render the Grafana dashboard into {OUT.name}.")
    ap.add_argument("--check", action="store_true",
                    help="only say whether the committed JSON is what this code renders")
    args = ap.parse_args()
    text = json.dumps(render(), indent=2, ensure_ascii=False) + "\n"
    if args.check:
        if OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT} is stale: run python {Path(__file__).as_posix()}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
