"""Prometheus metrics of the TTS service (names fixed by design.md section 6).

One `TTSMetrics` per server, on its own registry, so that tests can run several servers
in one process. The HTTP side (`/metrics`, `/healthz`) lives in `http.py`.

Per-call metrics carry a `protocol` label (`PROTOCOLS`: gRPC, the OpenAI-style HTTP
endpoint, the WebSocket): one engine and one admission serve all three, and a dashboard
can still tell them apart. Sum over it for the service's totals.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

# TTFA targets sit around 25-100 ms on a GPU and ~1 s on a CPU: cover both.
_LATENCY_BUCKETS = (0.005, 0.01, 0.015, 0.02, 0.025, 0.035, 0.05, 0.075, 0.1, 0.15, 0.2,
                    0.3, 0.5, 0.75, 1.0, 2.0, 5.0)
_RTF_BUCKETS = (0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 5.0)
_STEP_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.03, 0.05,
                 0.1, 0.25, 0.5, 1.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
PROTOCOLS = ("grpc", "http", "websocket")


class TTSMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttfa = Histogram("tts_ttfa_seconds", "First text of an utterance in -> its "
                              "first audio out of the engine, server side",
                              ["protocol"], buckets=_LATENCY_BUCKETS, registry=r)
        self.rtf = Histogram("tts_rtf", "Synthesis wall time / audio duration per utterance",
                             ["protocol"], buckets=_RTF_BUCKETS, registry=r)
        self.requests = Counter("tts_requests_total", "Calls opened (gRPC Synthesize, HTTP "
                                "speech requests, WebSocket sessions), admitted or not",
                                ["protocol"], registry=r)
        self.active_sessions = Gauge("tts_active_sessions", "Open calls (Synthesize streams, "
                                     "HTTP speech responses, WebSocket sessions)",
                                     ["protocol"], registry=r)
        self.frames_sent = Counter("tts_frames_sent_total", "Audio frames written to clients",
                                   registry=r)
        self.step_seconds = Histogram("tts_engine_step_seconds", "Wall time of one engine "
                                      "step (all active sessions)", buckets=_STEP_BUCKETS,
                                      registry=r)
        self.batch_size = Histogram("tts_engine_batch_size", "Sessions advanced by one "
                                    "engine step", buckets=_BATCH_BUCKETS, registry=r)
        self.errors = Counter("tts_errors_total", "Calls ended with an error, by gRPC status "
                              "(HTTP and WebSocket errors map from it: protocol.py)",
                              ["code", "protocol"], registry=r)
        self.flow_pauses = Counter("tts_flow_control_pauses_total", "Sessions paused in the "
                                   "engine: more than TTS_MAX_BACKLOG_S of their audio made "
                                   "but not written (a slow reader, or paced audio far "
                                   "ahead)", registry=r)
        self.utterances = Counter("tts_utterances_total", "Utterances by how they ended",
                                  ["reason", "protocol"], registry=r)
        # Admission (admission.py): why calls were turned away, and how full the engine is.
        self.admission_rejected = Counter(
            "tts_admission_rejected_total", "Calls rejected with RESOURCE_EXHAUSTED, by "
            "reason: sessions (open-stream cap), capacity (the engine would fall behind "
            "real time), front (the gRPC front would)", ["reason", "protocol"], registry=r)
        self.admission_load = Gauge("tts_admission_load_sessions", "Streams counted as "
                                    "engine load: speaking + admitted, not speaking yet",
                                    registry=r)
        self.admission_period = Gauge("tts_admission_frame_period_seconds", "Predicted "
                                      "time between engine steps at the current load (real "
                                      "time needs < 0.08)", registry=r)
        self.admission_headroom = Gauge("tts_admission_headroom_sessions", "More speaking "
                                        "streams the engine's frame period allows now",
                                        registry=r)
        self.admission_front = Gauge("tts_admission_front_cpu_share", "The event loop's "
                                     "CPU share of a core predicted at the open streams now "
                                     "(its measured share per open stream)", registry=r)
        self.gpu_memory = Gauge("tts_gpu_memory_bytes", "CUDA memory of the engine's device "
                                "(torch allocator: allocated, reserved), sampled after steps",
                                ["kind"], registry=r)

        # What is served and how (a benchmark against a running server names it from here).
        self.server_info = Info("tts_server", "The model served and the settings that set "
                                "its capacity", registry=r)

        # The voice library (voice_library.py).
        self.library_voices = Gauge("tts_library_voices", "Library voices this server "
                                    "speaks (cloned and designed; presets not counted)",
                                    registry=r)
        self.voice_create = Histogram("tts_voice_create_seconds", "Making a library voice: "
                                      "its prompt (x-vector, reference codes) and its file",
                                      ["kind"], buckets=_LATENCY_BUCKETS, registry=r)

    def of(self, protocol: str) -> CallMetrics:
        return CallMetrics(self, protocol)

    def watch_admission(self, admission: Any) -> None:
        """The admission gauges read `admission` when scraped (no cost per step)."""
        self.admission_load.set_function(admission.load)
        self.admission_period.set_function(lambda: admission.predicted_period_ms() / 1e3)
        self.admission_headroom.set_function(admission.headroom)
        self.admission_front.set_function(admission.predicted_front_share)


class CallMetrics:
    """What a call records, bound to its protocol's label children once (no label lookup
    per frame)."""

    def __init__(self, m: TTSMetrics, protocol: str) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {protocol!r}")
        self.protocol = protocol
        self.ttfa = m.ttfa.labels(protocol)
        self.rtf = m.rtf.labels(protocol)
        self.requests = m.requests.labels(protocol)
        self.active_sessions = m.active_sessions.labels(protocol)
        self.frames_sent = m.frames_sent
        self.flow_pauses = m.flow_pauses
        self._m = m

    def utterances(self, reason: str) -> Any:
        return self._m.utterances.labels(reason, self.protocol)

    def error(self, code: str) -> Any:
        return self._m.errors.labels(code, self.protocol)

    def rejected(self, reason: str) -> Any:
        return self._m.admission_rejected.labels(reason, self.protocol)
