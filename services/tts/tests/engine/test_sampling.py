"""Our batched logits processing equals Hugging Face's processors that the official
`generate` builds (repetition penalty, min_new_tokens, suppress_tokens, temperature,
top-k, top-p), run in the oracle venv on the same logits. Sampling itself draws from
the resulting distribution (exponential race), so equal processed scores = same
distribution."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
import torch
from voice_tts.engine.sampling import (
    SamplingTensors,
    suppress_mask,
    talker_scores,
    warp,
    warp_and_sample,
)

from .lib import oracle_python

V, EOS = 3072, 2150
HF = """
import json, sys
import numpy as np, torch
from transformers.generation.logits_process import (
    LogitsProcessorList, MinNewTokensLengthLogitsProcessor, RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)
spec = json.load(open(sys.argv[1]))
logits = torch.tensor(np.load(sys.argv[2]))
out = []
for row, case in enumerate(spec["rows"]):
    procs = [RepetitionPenaltyLogitsProcessor(case["penalty"]),
             MinNewTokensLengthLogitsProcessor(0, 2, spec["eos"]),
             SuppressTokensLogitsProcessor(spec["suppress"]),
             TemperatureLogitsWarper(case["temperature"]), TopKLogitsWarper(case["top_k"])]
    if case["top_p"] < 1.0:
        procs.append(TopPLogitsWarper(case["top_p"]))
    ids = torch.tensor([case["generated"]], dtype=torch.long).reshape(1, -1)
    out.append(LogitsProcessorList(procs)(ids, logits[row:row + 1].clone())[0].numpy())
np.save(sys.argv[3], np.stack(out))
"""

ROWS = [  # generated tokens so far, penalty, temperature, top_k, top_p
    ([], 1.05, 0.9, 50, 1.0),
    ([5, 17, 5], 1.05, 0.9, 50, 1.0),
    ([EOS - 1, 3, 9, 12, 40], 1.3, 0.7, 20, 0.8),
    ([1, 2, 3, 4, 5, 6, 7], 1.05, 1.2, 3000, 0.95),
]


def test_processors_match_hugging_face(tmp_path):
    python = oracle_python()
    if python is None:
        pytest.skip("no oracle interpreter")
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(len(ROWS), V, generator=gen) * 3
    logits[:, EOS] = 20  # EOS on top: masked while fewer than 2 tokens were generated
    suppress = suppress_mask(V, EOS)
    np.save(tmp_path / "logits.npy", logits.numpy())
    (tmp_path / "spec.json").write_text(json.dumps({
        "eos": EOS, "suppress": [int(i) for i in torch.nonzero(suppress).flatten()],
        "rows": [{"generated": g, "penalty": pen, "temperature": t, "top_k": k, "top_p": p}
                 for g, pen, t, k, p in ROWS]}))
    subprocess.run([str(python), "-c", HF, str(tmp_path / "spec.json"),
                    str(tmp_path / "logits.npy"), str(tmp_path / "hf.npy")],
                   check=True, capture_output=True, timeout=120)
    theirs = np.load(tmp_path / "hf.npy")

    seen = torch.zeros(len(ROWS), V, dtype=torch.bool)
    for i, (g, *_rest) in enumerate(ROWS):
        seen[i, g] = True
    params = SamplingTensors(
        do_sample=torch.ones(len(ROWS), dtype=torch.bool),
        temperature=torch.tensor([r[2] for r in ROWS]),
        top_k=torch.tensor([r[3] for r in ROWS]), top_p=torch.tensor([r[4] for r in ROWS]))
    scores = talker_scores(logits, seen, torch.tensor([r[1] for r in ROWS]),
                           torch.tensor([len(r[0]) for r in ROWS]), suppress, EOS)
    ours = warp(scores, params).numpy()
    assert np.array_equal(np.isinf(ours), np.isinf(theirs))
    finite = np.isfinite(ours)
    np.testing.assert_allclose(ours[finite], theirs[finite], rtol=1e-6, atol=1e-6)
    assert np.isinf(ours[0, EOS]) and np.isfinite(ours[1:, EOS]).all()  # min_new_tokens=2


def test_sampling_is_categorical_and_greedy_is_argmax():
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]]).expand(4, -1).clone()
    p = SamplingTensors(do_sample=torch.tensor([True, True, False, True]),
                        temperature=torch.ones(4), top_k=torch.full((4,), 4),
                        top_p=torch.ones(4))
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(4)
    for _ in range(4000):
        noise = torch.empty(4, 4).exponential_(generator=gen)
        tokens = warp_and_sample(logits, p, noise)
        assert tokens[2] == 2  # greedy row
        counts[tokens[0]] += 1
    np.testing.assert_allclose((counts / 4000).numpy(), logits[0].softmax(-1).numpy(),
                               atol=0.03)
