"""PNG plots of a run (matplotlib, Agg: no display needed).

- reply_<case>.png: the post-RTC reply waveform with pre-RTC under it, silent gaps
  shaded (red where they count as dropouts is not tracked here: every gap >= the
  dropout minimum is shaded), and the frame inter-arrival times below.
- latency.png: the distribution of EoT -> first audio over the cases (with P50/P95 and
  the gate), and the per-case breakdown of the agent's stages.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: CI and servers have no display

import matplotlib.pyplot as plt
import numpy as np

from .audio_metrics import HOP_MS, envelope_db


def reply_plot(path: Path, *, case_id: str, post: np.ndarray, rate: int,
               arrivals: list[float], pre: np.ndarray | None, pre_rate: int,
               silence_dbfs: float, gap_min_ms: int, title_extra: str = "") -> Path:
    fig, axes = plt.subplots(3, 1, figsize=(10, 6.5), constrained_layout=True)
    t = np.arange(len(post)) / rate
    ax = axes[0]
    ax.plot(t, post, lw=0.4, color="tab:blue")
    env = envelope_db(post, rate)
    silent = env < silence_dbfs
    start = None
    for i, s in enumerate([*silent, False]):
        if s and start is None:
            start = i
        elif not s and start is not None:
            if (i - start) * HOP_MS >= gap_min_ms:
                ax.axvspan(start * HOP_MS / 1000, i * HOP_MS / 1000, color="red", alpha=0.25)
            start = None
    ax.set_ylim(-1.05, 1.05)
    ax.set_title(f"{case_id}: post-RTC reply {title_extra}".strip())
    ax.set_ylabel("post")
    ax = axes[1]
    if pre is not None and len(pre):
        ax.plot(np.arange(len(pre)) / pre_rate, pre, lw=0.4, color="tab:green")
    else:
        ax.text(0.5, 0.5, "no pre-RTC audio", ha="center", transform=ax.transAxes)
    ax.set_ylim(-1.05, 1.05)
    ax.set_xlim(axes[0].get_xlim())  # same time axis: inserted gaps show as a shift
    ax.set_ylabel("pre")
    ax.set_xlabel("s")
    ax = axes[2]
    if len(arrivals) > 1:
        ia = np.diff(arrivals) * 1000.0
        ax.plot(np.arange(1, len(arrivals)), ia, ".", ms=3)
        ax.axhline(30, color="red", lw=0.8, ls="--", label="gate 30 ms (P95)")
        ax.legend(loc="upper right", fontsize=8)
    ax.set_ylabel("inter-arrival ms")
    ax.set_xlabel("frame")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def latency_plot(path: Path, rows: list[dict[str, object]], gate_ms: float) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    vals = [float(v) for r in rows if isinstance(v := r.get("eot_to_first_audio_ms"), float | int)]
    ax = axes[0]
    if vals:
        ax.hist(vals, bins=min(20, max(3, len(vals))), color="tab:blue", alpha=0.8)
        for q, style in ((50, ":"), (95, "--")):
            ax.axvline(float(np.percentile(vals, q)), color="k", ls=style, label=f"P{q}")
        ax.axvline(gate_ms, color="red", label=f"gate {gate_ms:.0f} ms")
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no latency measured", ha="center", transform=ax.transAxes)
    ax.set_title("EoT -> first audio (ms)")
    ax = axes[1]
    names = [str(r["case_id"]) for r in rows]
    stages = ("stt_ms", "llm_ttft_ms", "tts_ttfa_ms", "tts_first_to_publish_ms")
    left = np.zeros(len(rows))
    for st in stages:
        v = np.array([float(x) if isinstance(x := r.get(st), float | int) else 0.0
                      for r in rows])
        ax.barh(names, v, left=left, label=st.removesuffix("_ms"))
        left += v
    # What the stages do not cover: the VAD hangover and the endpointing delay (mostly).
    total = np.array([float(x) if isinstance(x := r.get("eot_to_first_audio_ms"), float | int)
                      else 0.0 for r in rows])
    ax.barh(names, np.maximum(total - left, 0.0), left=left, color="lightgrey",
            label="vad + endpointing + rest")
    ax.set_title("agent stages per case (ms)")
    ax.legend(fontsize=7)
    ax.tick_params(axis="y", labelsize=7)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
