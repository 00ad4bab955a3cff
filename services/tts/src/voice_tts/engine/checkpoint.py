"""Load (and, for tests, write) the official Qwen3-TTS-12Hz checkpoint layout.

Layout of a local checkpoint directory (the Hugging Face repo as published):

    config.json                    Qwen3TTSConfig (talker_config, code_predictor_config, ...)
    model.safetensors              (or model-0000x-of-0000y.safetensors + the index json)
    generation_config.json         optional sampling defaults
    vocab.json merges.txt tokenizer_config.json   the Qwen2 text tokenizer (or tokenizer.json)
    speech_tokenizer/config.json   Qwen3TTSTokenizerV2Config (decoder_config, encoder_config)
    speech_tokenizer/model.safetensors

The published weight names are mapped to ours in ONE place, `WEIGHT_PREFIXES`: our
modules reuse the official attribute names below a prefix, so mapping is a prefix strip.
Names we do not use are listed in `IGNORED_PREFIXES`; anything else unknown is an error.
`speaker_encoder.*` (the Base model's ECAPA-TDNN) and the speech tokenizer's `encoder.*`
(its Mimi encoder: reference codes) are loaded iff `tts_model_type` is `ModelType.BASE`;
other types skip them (released CustomVoice checkpoints carry `encoder.*` too). An unknown
type is an error (`ModelConfig.from_dir` reads it).
No hub access: `path` must be a local directory.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from .config import ModelConfig
from .model import Qwen3TTS
from .model_type import ModelType

# (file, published prefix) -> our module prefix. The whole mapping lives here.
WEIGHT_PREFIXES: dict[tuple[str, str], str] = {
    ("model", "talker."): "talker.",
    ("model", "speaker_encoder."): "speaker_encoder.",
    ("speech_tokenizer", "decoder."): "speech_decoder.",
    ("speech_tokenizer", "encoder."): "speech_encoder.",
}
IGNORED_PREFIXES: dict[str, tuple[str, ...]] = {
    "model": (),
    "speech_tokenizer": (),
}
# Derived buffers some exports carry; we recompute them.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def default_dtype(device: torch.device | str) -> torch.dtype:
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def _read_safetensors(directory: Path, stem: str = "model") -> dict[str, torch.Tensor]:
    index = directory / f"{stem}.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        tensors: dict[str, torch.Tensor] = {}
        for f in files:
            tensors.update(load_file(directory / f))
        return tensors
    single = directory / f"{stem}.safetensors"
    if not single.exists():
        raise FileNotFoundError(f"no {stem}.safetensors (or index) in {directory}")
    return load_file(single)


def map_weights(file: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Published names of one file -> our state_dict names."""
    out: dict[str, torch.Tensor] = {}
    unknown = []
    for name, t in tensors.items():
        if name.endswith(IGNORED_SUFFIXES):
            continue
        for (f, src), dst in WEIGHT_PREFIXES.items():
            if f == file and name.startswith(src):
                out[dst + name[len(src):]] = t
                break
        else:
            if not name.startswith(IGNORED_PREFIXES[file]):
                unknown.append(name)
    if unknown:
        raise ValueError(f"unexpected weights in {file}: {unknown[:8]}")
    return out


def load_model(path: str | Path, device: torch.device | str = "cpu",
               dtype: torch.dtype | None = None) -> Qwen3TTS:
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint directory not found: {path} (no hub access; "
                                "download the model and pass its local path)")
    cfg = ModelConfig.from_dir(path)  # ValueError: an unknown tts_model_type
    with torch.device("meta"):
        model = Qwen3TTS(cfg)
    state = map_weights("model", _read_safetensors(path))
    state.update(map_weights("speech_tokenizer", _read_safetensors(path / "speech_tokenizer")))
    if model.speaker_encoder is None:  # only Base builds it (as the official model)
        state = {k: v for k, v in state.items() if not k.startswith("speaker_encoder.")}
    if model.speech_encoder is None:  # reference codes are for Base (cloning) only
        state = {k: v for k, v in state.items() if not k.startswith("speech_encoder.")}
    expected = set(model.state_dict())
    unexpected = set(state) - expected
    if unexpected:
        raise ValueError(f"checkpoint {path} has unexpected weights: {sorted(unexpected)[:8]}")
    missing = expected - set(state)
    if any(k.startswith("speaker_encoder.") for k in missing):
        raise ValueError(f"checkpoint {path} is a Base model (tts_model_type "
                         f"'{ModelType.BASE}') but lacks "
                         f"speaker encoder weights: {sorted(missing)[:8]}")
    if missing:
        raise ValueError(f"checkpoint {path} lacks weights: {sorted(missing)[:8]}")
    model.load_state_dict(state, strict=True, assign=True)
    _materialize_buffers(model)
    return prepare(model, device, dtype)


def prepare(model: Qwen3TTS, device: torch.device | str = "cpu",
            dtype: torch.dtype | None = None) -> Qwen3TTS:
    """Move to `device`: talker + code predictor in `dtype` (bf16 on CUDA, float32 on CPU
    by default), the speech decoder always in float32 (streamed == whole decode needs it:
    see `model/speech_decoder.py`)."""
    # Cast the talker alone: a float32 part sent through bf16 and back would keep
    # bf16-rounded weights (and RoPE frequencies).
    model = model.to(device=device)
    model.talker.to(dtype=dtype or default_dtype(device))
    model.speech_decoder.float()
    if model.speaker_encoder is not None:  # voice creation runs off the hot path in float32
        model.speaker_encoder.float()
    if model.speech_encoder is not None:
        model.speech_encoder.float()
    return model.eval()


def _materialize_buffers(model: Qwen3TTS) -> None:
    """Recompute non-persistent buffers (RoPE inverse frequencies) left on the meta device."""
    from .model.layers import rope_inv_freq

    for mod, cfg in ((model.talker, model.cfg.talker),
                     (model.talker.code_predictor, model.cfg.code_predictor),
                     (model.speech_decoder.pre_transformer, model.cfg.speech_decoder)):
        mod.inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta)
    if model.speech_encoder is not None:
        enc = model.cfg.speech_encoder
        model.speech_encoder.encoder_transformer.inv_freq = rope_inv_freq(enc.head_dim,
                                                                          enc.rope_theta)


# --- random weights (tests, CPU demos, GPU benchmarks at the real shapes) --------------------

@torch.no_grad()
def random_model(cfg: ModelConfig, seed: int = 0) -> Qwen3TTS:
    """Build `cfg` with deterministic random weights that give non-trivial audio."""
    gen = torch.Generator().manual_seed(seed)
    model = Qwen3TTS(cfg)
    for name, p in sorted(model.named_parameters()):
        leaf = name.rsplit(".", 1)[-1]
        if "norm" in name and leaf == "weight":
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        elif leaf in ("alpha", "beta"):  # SnakeBeta (log-scale)
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        elif leaf == "cluster_usage":
            p.copy_(0.5 + torch.rand(p.shape, generator=gen))
        elif leaf == "embedding_sum":
            p.copy_(torch.randn(p.shape, generator=gen))
        elif leaf in ("scale", "gamma"):
            p.copy_(0.1 + 0.05 * torch.randn(p.shape, generator=gen))
        elif leaf == "bias":
            p.copy_(0.02 * torch.randn(p.shape, generator=gen))
        elif "embedding" in name:
            p.copy_(0.5 * torch.randn(p.shape, generator=gen))
        else:  # linear / conv weights: unit-gain fan-in scaling
            fan_in = p[0].numel() if p.dim() > 1 else p.numel()
            p.copy_(torch.randn(p.shape, generator=gen) / fan_in ** 0.5)
    # Keep the random vocoder's level sane (mostly inside [-1, 1], so little clamping):
    # damp each residual unit's output conv and the final conv.
    dec = model.speech_decoder.decoder
    for block in dec[1:-2]:
        for unit in block.block[2:]:
            unit.conv2.conv.weight.mul_(0.3)
    dec[-1].conv.weight.mul_(0.3)
    if model.speech_encoder is not None:
        _random_codebooks(model.speech_encoder, gen)
    return model.eval()


def _random_codebooks(encoder: nn.Module, gen: torch.Generator) -> None:
    """The official init zeros `embed_sum` (every code would be 0): give each codebook
    random rows at the scale of the residual it quantizes (~0.4 per dim for random latents,
    shrinking down the RVQ), usage in [0.5, 1.5) so the division matters."""
    quantizer = encoder.quantizer
    for rvq in (quantizer.semantic_residual_vector_quantizer,
                quantizer.acoustic_residual_vector_quantizer):
        for k, vq in enumerate(rvq.layers):
            book = vq.codebook
            book.initialized.fill_(1.0)
            book.cluster_usage.copy_(0.5 + torch.rand(book.cluster_usage.shape, generator=gen))
            rows = 0.4 * 0.75 ** k * torch.randn(book.embed_sum.shape, generator=gen)
            book.embed_sum.copy_(rows * book.cluster_usage[:, None])


def save_checkpoint(model: Qwen3TTS, path: str | Path, text_tokenizer_dir: str | Path | None = None,
                    shard_bytes: int | None = None) -> Path:
    """Write `model` in the official layout (names inverted through WEIGHT_PREFIXES)."""
    path = Path(path)
    (path / "speech_tokenizer").mkdir(parents=True, exist_ok=True)
    cfg, speech_cfg = model.cfg.to_hf_dict()
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    (path / "speech_tokenizer" / "config.json").write_text(json.dumps(speech_cfg, indent=2))
    (path / "speech_tokenizer" / "preprocessor_config.json").write_text(
        json.dumps(preprocessor_config(model.cfg), indent=2))
    files: dict[str, dict[str, torch.Tensor]] = {"model": {}, "speech_tokenizer": {}}
    for name, t in model.state_dict().items():
        for (f, src), dst in WEIGHT_PREFIXES.items():
            if name.startswith(dst):
                files[f][src + name[len(dst):]] = t.detach().to("cpu").contiguous()
                break
    _write(files["model"], path, shard_bytes)
    _write(files["speech_tokenizer"], path / "speech_tokenizer", None)
    if text_tokenizer_dir is not None:
        for f in Path(text_tokenizer_dir).iterdir():
            if f.is_file():
                (path / f.name).write_bytes(f.read_bytes())
    return path


def preprocessor_config(cfg: ModelConfig) -> dict:
    """speech_tokenizer/preprocessor_config.json: the official `Qwen3TTSTokenizer` reads its
    feature extractor from it (mono, no normalisation: it only batches the waveform)."""
    return {"feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1,
            "sampling_rate": cfg.speech_encoder.sampling_rate, "padding_value": 0.0,
            "padding_side": "right", "return_attention_mask": True, "chunk_length_s": None,
            "overlap": None}


def _write(tensors: dict[str, torch.Tensor], directory: Path, shard_bytes: int | None) -> None:
    meta = {"format": "pt"}
    if not shard_bytes:
        save_file(tensors, directory / "model.safetensors", metadata=meta)
        return
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(tensors):
        t = tensors[name]
        if size and size + t.numel() * t.element_size() > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += t.numel() * t.element_size()
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, directory / fname, metadata=meta)
        weight_map.update({n: fname for n in shard})
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2))


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
