"""Helpers: the real TTS server and the real thinker, as subprocesses from their venvs.

Both run tiny random-weight models on localhost (free ports): the TTS speaks noise and
the thinker writes gibberish, so the tests assert behaviour (audio produced, timing,
cancellation, state transitions), never content. The thinker's transformers backend
is text-only: it answers INVALID_ARGUMENT for audio, so the session tests run the STT
in its named "placeholder" fallback (see plugins/stt.py).

No LiveKit server exists on these machines: the session tests run the real
AgentSession on our own audio I/O (direct mode) instead of a room.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
from voice_testkit import free_port, metric_value, stop_process, wait_grpc_serving

REPO = Path(__file__).resolve().parents[3]


class Server:
    """One backend process; `kill()` simulates a crash (SIGKILL), `stop()` is graceful."""

    def __init__(self, name: str, module: str, venv: str, env_prefix: str, tmp: Path,
                 **env: str) -> None:
        python = REPO / ".venv" / venv / "bin" / "python"
        if not python.exists():
            pytest.fail(f"{python} missing: build it with `make venvs` (the Makefile's "
                        f".venv/{venv}) before the agent tests")
        self.grpc_port, self.http_port = free_port(), free_port()
        self.addr = f"127.0.0.1:{self.grpc_port}"
        self.log_path = tmp / f"{name}-{self.grpc_port}.log"
        full_env = {**os.environ, **env, f"{env_prefix}_GRPC_PORT": str(self.grpc_port),
                    f"{env_prefix}_HTTP_PORT": str(self.http_port)}
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen([str(python), "-m", module], env=full_env, cwd=REPO,
                                     stdout=self._log, stderr=subprocess.STDOUT)

    def wait_serving(self, timeout: float = 180.0) -> None:
        wait_grpc_serving(self.addr, self.proc, timeout, log=self.log_path)

    def metric(self, name: str) -> float:
        """Sum of a Prometheus sample over its labels (0 if declared with no samples)."""
        url = f"http://127.0.0.1:{self.http_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            return metric_value(r.read().decode(), name)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        stop_process(self.proc, timeout=15)
        self._log.close()


def start_tts(tmp: Path) -> Server:
    s = Server("tts", "voice_tts.server", "tts", "TTS", tmp, TTS_MODEL="preset:tiny")
    s.wait_serving()
    return s


def start_thinker(tmp: Path, asr_dir: Path | None = None, **more_env: str) -> Server:
    env = {"LLM_ASR_MODEL": str(asr_dir)} if asr_dir is not None else {}
    env.update(more_env)
    s = Server("thinker", "voice_llm.server", "llm", "LLM", tmp,
               LLM_BACKEND="transformers", LLM_MODEL="tiny-random", **env)
    s.wait_serving()
    key = env.get("LLM_API_KEYS", "").split(",")[0]
    warm_thinker(s.addr, key)
    return s


# A tiny random wav2vec2-CTC (the thinker's own ASR test builds the same): with it as
# LLM_ASR_MODEL the text-only tiny thinker takes audio parts (ASR step, then the LLM), so
# the STT plugin's real path runs: utterance audio -> thinker -> text (gibberish).
_TINY_ASR = """
import json, sys, torch
from pathlib import Path
from transformers import (Wav2Vec2Config, Wav2Vec2CTCTokenizer, Wav2Vec2FeatureExtractor,
                          Wav2Vec2ForCTC, Wav2Vec2Processor)
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
letters = "abcdefghijklmnopqrstuvwxyz'"
vocab = {"<pad>": 0, "<unk>": 1, "|": 2, **{c: i + 3 for i, c in enumerate(letters)}}
(out / "vocab.json").write_text(json.dumps(vocab))
tok = Wav2Vec2CTCTokenizer(str(out / "vocab.json"), word_delimiter_token="|")
fe = Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, padding_value=0.0,
                              do_normalize=True, return_attention_mask=False)
Wav2Vec2Processor(feature_extractor=fe, tokenizer=tok).save_pretrained(out)
cfg = Wav2Vec2Config(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1,
    num_attention_heads=2, intermediate_size=37, conv_dim=(32, 32), conv_stride=(5, 4),
    conv_kernel=(10, 8), num_feat_extract_layers=2, num_conv_pos_embeddings=16,
    num_conv_pos_embedding_groups=2, pad_token_id=0, initializer_range=0.5,
    do_stable_layer_norm=True, feat_extract_norm="layer")
torch.manual_seed(0)
Wav2Vec2ForCTC(cfg).eval().save_pretrained(out)
"""


def build_tiny_asr(tmp: Path) -> Path:
    out = tmp / "tiny-wav2vec2"
    python = REPO / ".venv" / "llm" / "bin" / "python"
    subprocess.run([str(python), "-c", _TINY_ASR, str(out)], check=True, timeout=300)
    return out


def warm_thinker(addr: str, key: str = "") -> None:
    """One short Chat: the first generation of a fresh process pays torch's warm-up
    (about 1 s here), which is not what the latency numbers are about."""
    from voice.llm.v1 import thinker_pb2, thinker_pb2_grpc

    with grpc.insecure_channel(addr) as ch:
        stub = thinker_pb2_grpc.ThinkerStub(ch)
        req = thinker_pb2.ChatRequest(max_tokens=4, messages=[thinker_pb2.Message(
            role=thinker_pb2.ROLE_USER, parts=[thinker_pb2.Part(text="hi")])])
        meta = (("authorization", f"Bearer {key}"),) if key else ()
        for _ in stub.Chat(req, timeout=60, metadata=meta):
            pass


def espeak(text: str, tmp: Path, voice: str = "en", wpm: int = 175) -> np.ndarray:
    """Real speech from espeak-ng (services/agent/setup.sh installs it), int16 at 16 kHz."""
    if shutil.which("espeak-ng") is None:
        pytest.fail("espeak-ng missing: run services/agent/setup.sh")
    from voice_agent.direct import read_wav_16k

    path = tmp / f"espeak-{abs(hash((text, voice, wpm)))}.wav"
    subprocess.run(["espeak-ng", "-v", voice, "-s", str(wpm), "-w", str(path), text],
                   check=True)
    return read_wav_16k(path)
