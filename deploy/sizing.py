"""One number sizes the stack: STACK_CONVERSATIONS, the conversations one GPU's stack takes
at once. Every cap that bounds conversations follows from it, here and nowhere else:

    python3 deploy/sizing.py 128                   # the compose variables for 128 (KEY=value)
    python3 deploy/sizing.py 128 --k8s deploy/k8s  # rewrite the manifests' caps for 128

- Agent processes: one carries PER_PROCESS conversations (its event loop is one core).
- Agent slots (AGENT_WS_MAX_SESSIONS, a process's cap): its share of N times SPREAD. In
  compose the processes share one port (SO_REUSEPORT) and the kernel hashes each connection
  to one of them, evenly on average but not exactly: a process can be full while another
  has room. SPREAD is that headroom (`spread_refusals` computes what it leaves).
- The thinker (LLM_MAX_CONCURRENT, vLLM's LLM_MAX_NUM_SEQS) and the TTS (TTS_MAX_SESSIONS,
  per checkpoint) take every conversation the agents may admit, all their slots: a
  conversation one agent let in never meets a full backend (the issue's "nobody admitted
  degrades"). A conversation has one thinker call and one TTS stream at a time (the
  transcript, then the reply; one reply stream).
- The TTS's device memory cap (MPS) follows its slots, or its engine would not start.

`make up` (deploy/dotenv.py) writes the compose variables into .env from its
STACK_CONVERSATIONS; the Kubernetes manifests hold the same numbers, rewritten by `--k8s`.
What it does not know: the GPU's memory and the thinker's (set by LLM_* as before).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

VAR = "STACK_CONVERSATIONS"
# The most whose caps fit one 80 GB GPU (H100: 79.6 GiB) beside compose's thinker, the bf16
# Qwen3-Omni-30B-A3B at LLM_GPU_MEMORY_UTILIZATION 0.8 (63.7 GiB; its MPS cap 64G): 15.6 GiB
# are left, and 10 gives the TTS 16 slots a checkpoint, 15G (14.6 GiB measured), where 11
# wants 16G. 64 (what one H100 held at p95 <= 800 ms with a 1.7B thinker, bench/README.md)
# needs an H200-class GPU or a smaller/AWQ thinker (deploy/README.md).
DEFAULT = 10
# Conversations one agent process carries: 8 processes x 8 held 64 (H100 run 1, p95 653
# ms); at ~0.075 core a conversation that is 0.6 of the core its event loop runs on (16
# would want 1.2: at ~12 a process the loops ran late and refused callers).
PER_PROCESS = 8
# Slots a process has over its share of N: at N callers at once the kernel's hash refuses
# ~1.2 % (N=64: 8 processes x 12; 1.6 % for large N) while another process has room,
# ~0.1-0.2 % at 3/4 of N.
SPREAD = 1.5
# The TTS's device memory (GiB) on its MPS cap: the CUDA context, each checkpoint's weights
# and graphs, and each slot's KV cache (0.6B at TTS_MAX_SEQ_LEN=2048), fitted to the H100's
# 8.3 GiB (one checkpoint x 16 slots), 14.6 (two x 16) and 21.9 (two x 32)
# (services/tts/README.md "Several checkpoints").
TTS_GIB_CONTEXT, TTS_GIB_CHECKPOINT, TTS_GIB_SLOT = 2.0, 2.65, 0.228
# compose's TTS_MODEL: presets and clones, each with TTS_MAX_SESSIONS slots.
TTS_CHECKPOINTS = 2
# The HPAs add a GPU pod at this share of a pod's cap: room for the calls that come while
# a new GPU node boots and warms up (minutes).
HPA_SHARE = 0.75
# The cpu profile (tiny models on a small host, `make up` without a GPU): one agent process
# with the slots it had before sizing; its tts-cpu and llm-cpu keep their own caps.
CPU_PROFILE = {"AGENT_PROCS": "1", "AGENT_WS_MAX_SESSIONS": "4"}


@dataclass(frozen=True)
class Caps:
    conversations: int
    agent_procs: int  # processes (compose: in the agent container; k8s: pods)
    agent_slots: int  # AGENT_WS_MAX_SESSIONS, each process's
    tts_checkpoints: int = TTS_CHECKPOINTS

    @property
    def slots(self) -> int:
        """Every conversation the agents may admit: what the backends must take."""
        return self.agent_procs * self.agent_slots

    @property
    def tts_gib(self) -> int:
        return math.ceil(TTS_GIB_CONTEXT + self.tts_checkpoints
                         * (TTS_GIB_CHECKPOINT + self.slots * TTS_GIB_SLOT))

    def compose_env(self) -> dict[str, str]:
        """The .env variables of the compose `gpu` profile (and the agent of both)."""
        return {
            "AGENT_PROCS": str(self.agent_procs),
            "AGENT_WS_MAX_SESSIONS": str(self.agent_slots),
            "LLM_MAX_CONCURRENT": str(self.slots),
            "LLM_MAX_NUM_SEQS": str(self.slots),
            "TTS_MAX_SESSIONS": str(self.slots),
            "TTS_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={self.tts_gib}G",
        }

    def hpa_target(self, cap: int) -> int:
        return max(1, math.floor(cap * HPA_SHARE))


def caps(conversations: int, tts_checkpoints: int = TTS_CHECKPOINTS) -> Caps:
    if conversations < 1:
        raise ValueError(f"{VAR}={conversations}: expected a whole number >= 1")
    procs = math.ceil(conversations / PER_PROCESS)
    # One process has no spread to absorb: exactly N.
    slots = conversations if procs == 1 else math.ceil(SPREAD * conversations / procs)
    return Caps(conversations, procs, slots, tts_checkpoints)


def spread_refusals(callers: int, procs: int, slots: int) -> float:
    """Callers a full process is expected to refuse when `callers` arrive at once and the
    kernel hashes each to one of `procs` processes uniformly (binomial, log space)."""
    if procs == 1:
        return float(max(0, callers - slots))
    q = 1 / procs
    total = 0.0
    for k in range(slots + 1, callers + 1):
        log_p = (math.lgamma(callers + 1) - math.lgamma(k + 1) - math.lgamma(callers - k + 1)
                 + k * math.log(q) + (callers - k) * math.log1p(-q))
        total += (k - slots) * math.exp(log_p)
    return procs * total


# --- Kubernetes: the same numbers in deploy/k8s (one process a pod; its own GPU a pod) ------

def _env(text: str, name: str, value: int) -> str:
    new, n = re.subn(rf'(\{{name: {name}, value: )"[^"]*"', rf'\g<1>"{value}"', text)
    assert n == 1, f"expected one {name} env entry, found {n}"
    return new


def _in_doc(text: str, kind: str, name: str, pattern: str, value: int) -> str:
    """Set `pattern`'s number (its one group) in the YAML document of that kind and name."""
    docs = text.split("\n---\n")
    hits = 0
    for i, doc in enumerate(docs):
        if re.search(rf"^kind: {kind}$", doc, re.M) and re.search(
                rf"^  name: {name}$", doc, re.M):
            docs[i], n = re.subn(pattern, lambda m: m[0].replace(m[1], str(value)), doc,
                                 flags=re.M)
            hits += n
    assert hits == 1, f"{kind}/{name}: expected one {pattern!r}, found {hits}"
    return "\n---\n".join(docs)


def k8s_rewrite(caps_: Caps, k8s: Path) -> None:
    """The caps into the manifests (comments and layout kept)."""
    edits = {
        "agent.yaml": lambda t: _env(_in_doc(t, "Deployment", "agent", r"^  replicas: (\d+)$",
                                             caps_.agent_procs),
                                     "AGENT_WS_MAX_SESSIONS", caps_.agent_slots),
        "tts.yaml": lambda t: _env(t, "TTS_MAX_SESSIONS", caps_.slots),
        "thinker.yaml": lambda t: _env(_env(t, "LLM_MAX_CONCURRENT", caps_.slots),
                                       "LLM_MAX_NUM_SEQS", caps_.slots),
        "autoscaling.yaml": lambda t: _in_doc(
            _in_doc(_in_doc(t, "HorizontalPodAutoscaler", "agent", r"^  minReplicas: (\d+)$",
                            caps_.agent_procs),
                    "HorizontalPodAutoscaler", "tts", r'averageValue: "(\d+)"',
                    caps_.hpa_target(caps_.slots)),
            "HorizontalPodAutoscaler", "llm", r'averageValue: "(\d+)"',
            caps_.hpa_target(caps_.slots)),
    }
    for name, edit in edits.items():
        path = k8s / name
        path.write_text(edit(path.read_text()))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python3 deploy/sizing.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("conversations", nargs="?", type=int, default=DEFAULT,
                   help=f"{VAR} (default {DEFAULT})")
    p.add_argument("--k8s", type=Path, metavar="DIR",
                   help="rewrite the caps in this deploy/k8s directory instead of printing")
    p.add_argument("--cpu-profile", action="store_true",
                   help="print the cpu profile's agent variables (what `make up` exports)")
    args = p.parse_args(argv)
    if args.cpu_profile:
        print(" ".join(f"{k}={v}" for k, v in CPU_PROFILE.items()))
        return
    try:
        c = caps(args.conversations)
    except ValueError as e:
        raise SystemExit(f"sizing: {e}") from None
    if args.k8s:
        k8s_rewrite(c, args.k8s)
        print(f"sizing: {args.k8s} for {c.conversations} conversations: {c.agent_procs} agent "
              f"pods x {c.agent_slots} slots, TTS and thinker {c.slots} each", file=sys.stderr)
        return
    for k, v in c.compose_env().items():
        print(f"{k}={v}")


if __name__ == "__main__":
    main()
