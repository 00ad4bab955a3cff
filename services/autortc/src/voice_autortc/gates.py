"""Gates: hard PASS/FAIL thresholds over the metrics, each with its Suggested Fix.

The nine gates of seed 003 (section 5.3, D11-calibrated) are the defaults; we add the
Ring1 quality gates and the spike gate the P1 fingerprints need (our thresholds, to be
calibrated on a LiveKit baseline; see README). Thresholds are overridable per case
file (`"gates": {...}`) or per run (`--gate name=value`).

Two scopes:
- case gates run on every case's own metrics (a P0 case must pass all of them; a P1
  case must FAIL the ones its `expect_fail` names, proving the gate can fail);
- suite gates run once over the P0 cases (P95 of latencies, the valid rate, and the
  regression of the primary KPI against a baseline run).
A metric that could not be measured makes its gate SKIP, never PASS; the report
counts skips separately.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, "<": operator.lt, "==": operator.eq, ">=": operator.ge,
}

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
# Metrics where a negative value is measured (faster than the baseline; more 4-8 kHz
# energy after the link than before it); elsewhere -1 means "could not be measured".
SIGNED_METRICS = frozenset({"kpi_regression_ms", "hf_ratio_drop_db"})


@dataclass(frozen=True)
class Gate:
    name: str
    ring: str  # ring0 | ring1 | ring2 | suite
    scope: str  # case | suite
    metric: str  # key in the case metrics (case) or suite aggregates (suite)
    op: str
    threshold: float
    unit: str
    title: str
    fix: str  # Suggested Fix shown when it fails

    def check(self, value: float | None) -> str:
        if value is None or (value < 0 and self.metric not in SIGNED_METRICS):
            return SKIP
        return PASS if _OPS[self.op](value, self.threshold) else FAIL


GATES: tuple[Gate, ...] = (
    # --- seed 003 section 5.3: the nine AutoRTC gates ------------------------------------
    Gate("eot_to_first_audio_p95", "ring2", "suite", "eot_to_first_audio_p95_ms", "<=", 650,
         "ms", "EoT -> first audio P95",
         "Look at the turn breakdown (vad/stt/llm_ttft/tts_ttfa): lower "
         "AGENT_MIN_ENDPOINTING_DELAY_S / AGENT_VAD_SILENCE_MS, check the thinker's TTFT "
         "and the TTS's TTFA (first packet after 1-2 frames), and GPU contention (MPS)."),
    Gate("tts_first_to_publish_p95", "ring2", "suite", "tts_first_to_publish_p95_ms", "<=",
         120, "ms", "tts_first -> publish P95",
         "Frames must be pushed to the track as they arrive (seed D9): no re-buffering in "
         "the TTS plugin, AudioSource queue small, no blocking call on the event loop."),
    Gate("audible_dropouts", "ring0", "case", "audible_dropouts", "==", 0, "",
         "audible dropouts (reply)",
         "Audio lost in transport: check the agent's publish loop for underruns (TTS "
         "slower than real time -> check tts_rtf), packet loss / jitter buffer on the "
         "LiveKit side, and CPU starvation of the agent process."),
    Gate("max_gap", "ring0", "case", "max_gap_ms", "<", 350, "ms", "max gap in reply",
         "A long silence inside the reply: TTS stalled between segments (bridge flush, "
         "engine step starvation) or the transport stalled; compare pre_rtc.wav - if it "
         "has the gap too, it is the TTS/bridge, not RTC."),
    Gate("clipping_ratio", "ring0", "case", "clipping_ratio", "<", 0.001, "",
         "clipping ratio",
         "Samples at full scale: lower the output gain, check int16 conversion "
         "(saturate, never wrap), and look for clicks at packet boundaries."),
    Gate("llm_ttft_p95", "ring2", "suite", "llm_ttft_p95_ms", "<=", 80, "ms",
         "fast lane TTFT P95",
         "The thinker's first token is slow: check the GPU scheduler's fast lane (first "
         "token before TTS batch steps), vLLM prefix cache / max_model_len, and the "
         "prompt length (AGENT_MAX_CONTEXT_MESSAGES)."),
    Gate("p0_valid_rate", "suite", "suite", "p0_valid_rate", ">=", 1.0, "",
         "P0 audio valid rate",
         "A P0 case got no audible reply: see its capture_status (POST_SILENT = "
         "transport/probe, NO_REPLY = agent did not answer: check STT/LLM logs by "
         "trace_id), and rerun the case alone."),
    Gate("inter_arrival_p95", "ring0", "case", "inter_arrival_p95_ms", "<=", 30, "ms",
         "frame inter-arrival P95",
         "Frames arrive in bursts: the sender is not paced in real time or the network "
         "jitters; check the agent's publish cadence and CPU load on both ends."),
    Gate("kpi_regression", "suite", "suite", "kpi_regression_ms", "<=", 30, "ms",
         "primary KPI regression vs baseline",
         "EoT -> first audio P95 got worse than the baseline run: bisect the commits "
         "between the two runs (report.json has both), look at which turn stage grew."),
    # --- ours: Ring1 quality and the P1 fingerprints ---------------------------------------
    Gate("mel_distance", "ring1", "case", "mel_distance_db", "<=", 4.0, "dB",
         "mel distance pre vs post",
         "What arrived does not sound like what the TTS made: compare pre_rtc.wav and "
         "post_rtc_reply.wav; check codec settings (Opus bitrate, DTX), resampling on "
         "either side, and the sample rate the track was published at."),
    Gate("hf_ratio_drop", "ring1", "case", "hf_ratio_drop_db", "<=", 6.0, "dB",
         "HF (4-8 kHz) ratio drop",
         "High frequencies lost: a narrowband path (16 kHz or lower somewhere), a "
         "low-pass resampler, or a low Opus bitrate; publish at 48 kHz."),
    Gate("speed_drift", "ring1", "case", "speed_drift", "<=", 0.02, "",
         "speed drift (actual/expected - 1)",
         "The reply plays at the wrong rate: a sample-rate mismatch between the TTS "
         "frames and the AudioSource (e.g. 24 kHz frames published as 16/48 kHz)."),
    Gate("spikes", "ring0", "case", "spikes", "==", 0, "", "spikes / booms",
         "Clicks not present in pre_rtc: look for int16 overflow, frame splicing without "
         "cross-fade, or a stale buffer replayed after clear_buffer."),
    Gate("audio_valid", "ring0", "case", "audio_valid", "==", 1, "", "audible reply",
         "No audible reply: see capture_status; check the agent's logs for this "
         "trace_id, the probe's subscription (probe_ready) and the TTS server."),
    # --- ours: timing at the listener and turn-taking (README: Gates) ------------------------
    Gate("inter_arrival_max", "ring0", "case", "inter_arrival_max_ms", "<=", 100, "ms",
         "frame inter-arrival max",
         "Nothing arrived for this long inside the reply: a network stall or an underrun "
         "at the sender (see sender_late_ms: if the sender was late it is the TTS/agent, "
         "else the link); a jitter buffer only hides what it has buffered."),
    Gate("barge_in_cut", "ring2", "case", "barge_in_to_silence_ms", "<=", 500, "ms",
         "barge-in speech onset -> reply silent",
         "The reply went on over the user: check AGENT_ALLOW_INTERRUPTIONS, the VAD's "
         "min speech / AGENT_MIN_INTERRUPTION_MS, and that the barge-in cascade clears "
         "the output buffer (cancel_to_silence_ms) and sends STOP to the TTS."),
    Gate("backchannel_resumed", "ring2", "case", "backchannel_after_ms", ">=", 300, "ms",
         "reply audible after the backchannel",
         "A 'yeah' / 'okay' over the reply cut it: check AGENT_BACKCHANNEL_RESUME, what the "
         "agent heard (the case's transcript) against AGENT_BACKCHANNEL_WORDS, and "
         "AGENT_BACKCHANNEL_MAX_MS against the clip's length."),
    Gate("backchannel_lossless", "ring2", "case", "backchannel_unplayed_ms", "<=", 20, "ms",
         "reply audio dropped over a backchannel",
         "The reply went on but lost what was buffered when it paused: the output's "
         "resume() must play on from where pause() held it, not clear it."),
    Gate("backchannel_paused", "ring2", "case", "backchannel_pause_ms", ">=", 100, "ms",
         "reply paused for the backchannel",
         "The reply played on over the user: check AGENT_ALLOW_INTERRUPTIONS, the VAD "
         "(AGENT_VAD_ACTIVATION_THRESHOLD) and that the audio output can pause."),
    Gate("stt_wer", "ring2", "suite", "stt_wer_mean", "<=", 0.75, "",
         "word error rate of what the agent heard (mean over P0)",
         "The agent did not hear the user's words: check the STT backend in the agent's "
         "log (AGENT_STT_BACKEND / AGENT_STT_FALLBACK; 'placeholder' hears nothing), the "
         "microphone path's sample rate, and the case's input.wav."),
    Gate("early_reply", "ring2", "case", "early_reply_ms", "<=", 0, "ms",
         "agent spoke before the user finished",
         "The agent answered mid-sentence (a pause inside the turn was taken for its "
         "end): use a turn detector (end-of-utterance model) or a longer "
         "AGENT_MIN_ENDPOINTING_DELAY_S; see the case's input.wav and post_rtc_full.wav."),
)

GATE_NAMES = tuple(g.name for g in GATES)
# What proves a barge-in case, by its expect: measured or FAIL (no proof).
BARGE_IN_GATES = {"cut": ("barge_in_cut",),
                  "resume": ("backchannel_resumed", "backchannel_lossless",
                             "backchannel_paused")}
# Gates a deliberate pause breaks (SKIP in "resume" cases).
PAUSE_BREAKS = ("max_gap", "audible_dropouts", "inter_arrival_max", "inter_arrival_p95")
TRANSPORT_GATES = ("audible_dropouts", "max_gap", "clipping_ratio", "inter_arrival_p95",
                   "inter_arrival_max", "spikes", "audio_valid")


def configure(overrides: Mapping[str, float] | None = None) -> tuple[Gate, ...]:
    """The gates with thresholds overridden by name; an unknown name is an error."""
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(GATE_NAMES))
    if unknown:
        raise ValueError(f"unknown gate(s): {', '.join(unknown)} (known: "
                         f"{', '.join(GATE_NAMES)})")
    return tuple(replace(g, threshold=float(overrides[g.name])) if g.name in overrides else g
                 for g in GATES)


def parse_overrides(items: list[str]) -> dict[str, float]:
    """`--gate name=value` items -> {name: value}."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            out[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--gate {item!r}: expected name=number") from None
    return out


@dataclass(frozen=True)
class GateResult:
    name: str
    status: str
    value: float | None
    threshold: float
    op: str
    unit: str
    title: str
    fix: str

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "status": self.status, "value": self.value,
                "threshold": self.threshold, "op": self.op, "unit": self.unit}


def evaluate(gates: tuple[Gate, ...], scope: str,
             values: Mapping[str, float | None]) -> list[GateResult]:
    out = []
    for g in gates:
        if g.scope != scope:
            continue
        v = values.get(g.metric)
        out.append(GateResult(g.name, g.check(v), v, g.threshold, g.op, g.unit, g.title, g.fix))
    return out
