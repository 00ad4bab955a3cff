"""Model configuration: Qwen3-TTS-12Hz CustomVoice / Base / VoiceDesign (talker, code
predictor, speech decoder; Base adds the speaker encoder).

One frozen dataclass per model part plus `ModelConfig` for the whole, a table of named
presets (`ModelConfig.from_name`), and parsing of the official Hugging Face `config.json`
(+ `speech_tokenizer/config.json`). Field names follow the official config keys where a
key exists, so `from_hf_dict` is a plain rename table and `to_hf_dict` writes the same
file the official code reads (the test oracle loads what our writer saves).

Released shapes (design.md section 3): talker 0.6B hidden 1024 / 28 layers / MLP 3072,
1.7B hidden 2048 / MLP 6144; both use the same code predictor (hidden 1024, 5 layers)
and the same 12 Hz speech decoder. The `tiny` presets keep every structural feature
(GQA, interleaved M-RoPE sections, the talker->code-predictor projection in 1.7B) at
widths that run on a laptop CPU in milliseconds.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .model_type import ModelType

# Speaker / language tables of the presets. Real checkpoints bring their own from
# config.json; these ids only matter for random-weight presets (any id < vocab works).
_PRESET_SPEAKERS: dict[str, int] = {
    "vivian": 3065, "serena": 3066, "uncle_fu": 3010, "dylan": 2878, "eric": 2875,
    "ryan": 3061, "aiden": 2861, "ono_anna": 2873, "sohee": 2864,
}
_PRESET_DIALECT: dict[str, str | bool] = {
    name: False for name in _PRESET_SPEAKERS
} | {"dylan": "beijing_dialect", "eric": "sichuan_dialect"}
_PRESET_LANGUAGES: dict[str, int] = {
    "chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
    "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069,
    "beijing_dialect": 2074, "sichuan_dialect": 2062,
}


@dataclass(frozen=True)
class TalkerConfig:
    """The talker: a Qwen3 decoder over (text + codec) embeddings, emitting codebook 0."""

    hidden_size: int = 1024
    num_hidden_layers: int = 28
    intermediate_size: int = 3072
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 3072  # codec vocabulary of codebook 0 (+ control ids)
    text_vocab_size: int = 151936
    text_hidden_size: int = 2048
    rope_theta: float = 1e6
    mrope_section: tuple[int, ...] = (24, 20, 20)
    mrope_interleaved: bool = True
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768
    num_code_groups: int = 16
    codec_pad_id: int = 2148
    codec_bos_id: int = 2149
    codec_eos_token_id: int = 2150
    codec_think_id: int = 2154
    codec_nothink_id: int = 2155
    codec_think_bos_id: int = 2156
    codec_think_eos_id: int = 2157
    spk_id: dict[str, int] = field(default_factory=lambda: dict(_PRESET_SPEAKERS))
    spk_is_dialect: dict[str, str | bool] = field(default_factory=lambda: dict(_PRESET_DIALECT))
    codec_language_id: dict[str, int] = field(default_factory=lambda: dict(_PRESET_LANGUAGES))


@dataclass(frozen=True)
class CodePredictorConfig:
    """The code predictor: a small Qwen3 decoder predicting codebooks 1..15 of a frame."""

    hidden_size: int = 1024
    num_hidden_layers: int = 5
    intermediate_size: int = 3072
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 2048
    num_code_groups: int = 16
    rope_theta: float = 1e6
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    max_position_embeddings: int = 65536


@dataclass(frozen=True)
class SpeechDecoderConfig:
    """The 12 Hz speech-tokenizer decoder: 16 codebooks per frame -> 1920 samples at 24 kHz."""

    codebook_size: int = 2048
    codebook_dim: int = 512
    num_quantizers: int = 16
    hidden_size: int = 512
    latent_dim: int = 1024
    num_hidden_layers: int = 8
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 64
    intermediate_size: int = 1024
    sliding_window: int = 72
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    layer_scale_initial_scale: float = 0.01
    max_position_embeddings: int = 8000
    hidden_act: str = "silu"
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    decoder_dim: int = 1536
    sample_rate: int = 24000

    @property
    def frame_samples(self) -> int:
        n = 1
        for r in (*self.upsample_rates, *self.upsampling_ratios):
            n *= r
        return n


@dataclass(frozen=True)
class SpeechEncoderConfig:
    """The 12 Hz speech tokenizer's encoder (a Mimi encoder): 24 kHz audio -> reference codes.

    Field names are transformers' `MimiConfig` keys (`encoder_config` of
    speech_tokenizer/config.json); defaults are MimiConfig's, which the released 12 Hz
    tokenizer uses (32 quantizers, codebook 2048 x 256, hop 960 -> 25 Hz, then a stride-2
    downsample -> 12.5 Hz). `valid_num_quantizers` is the top-level
    `encoder_valid_num_quantizers`: the first 16 codebooks are the talker's. The decoder-side
    MimiConfig fields (`upsample_groups`, `trim_right_ratio`) are kept only so the file
    round-trips; `sliding_window` is ignored: the official loader sets full causal attention.
    """

    sampling_rate: int = 24000
    audio_channels: int = 1
    hidden_size: int = 512
    num_filters: int = 64
    num_residual_layers: int = 1
    upsampling_ratios: tuple[int, ...] = (8, 6, 5, 4)
    kernel_size: int = 7
    last_kernel_size: int = 3
    residual_kernel_size: int = 3
    dilation_growth_rate: int = 2
    use_causal_conv: bool = True
    pad_mode: str = "constant"
    compress: int = 2
    trim_right_ratio: float = 1.0
    codebook_size: int = 2048
    codebook_dim: int = 256
    num_quantizers: int = 32
    use_conv_shortcut: bool = False
    vector_quantization_hidden_dimension: int = 256
    num_semantic_quantizers: int = 1
    upsample_groups: int = 512
    num_hidden_layers: int = 8
    intermediate_size: int = 2048
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    head_dim: int = 64
    hidden_act: str = "gelu"
    max_position_embeddings: int = 8000
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    sliding_window: int = 250
    layer_scale_initial_scale: float = 0.01
    attention_bias: bool = False
    valid_num_quantizers: int = 16

    @property
    def frame_samples(self) -> int:
        """Input samples per output frame: the SEANet hop times the stride-2 downsample."""
        n = 2
        for r in self.upsampling_ratios:
            n *= r
        return n

    @classmethod
    def from_hf(cls, speech_cfg: dict[str, Any]) -> SpeechEncoderConfig:
        enc = dict(speech_cfg.get("encoder_config") or {})
        rope = enc.get("rope_parameters") or {}
        if "rope_theta" in rope:  # transformers 5 writes it here
            enc.setdefault("rope_theta", rope["rope_theta"])
        if not enc.get("head_dim"):  # MimiConfig: hidden_size // num_attention_heads
            enc["head_dim"] = (int(enc.get("hidden_size", cls.hidden_size))
                               // int(enc.get("num_attention_heads", cls.num_attention_heads)))
        if "encoder_valid_num_quantizers" in speech_cfg:
            enc["valid_num_quantizers"] = speech_cfg["encoder_valid_num_quantizers"]
        return _pick(cls, enc)

    def to_hf(self) -> dict[str, Any]:
        """The `encoder_config` dict (without `valid_num_quantizers`, a top-level key)."""
        d = dataclasses.asdict(self)
        del d["valid_num_quantizers"]
        d["upsampling_ratios"] = list(d["upsampling_ratios"])
        d["rope_parameters"] = {"rope_type": "default", "rope_theta": d["rope_theta"]}
        return d


@dataclass(frozen=True)
class SpeakerEncoderConfig:
    """The Base model's ECAPA-TDNN speaker encoder (official `speaker_encoder_config`).

    `mel_dim` must stay 128 (the official mel is hard-coded to 128 bands); `enc_dim` equals
    the talker's hidden size (the x-vector enters the prompt raw); `enc_channels[-1]` is
    the sum of the SE-Res2Net channels (`mfa` runs on their concatenation).
    """

    mel_dim: int = 128
    enc_dim: int = 1024
    enc_channels: tuple[int, ...] = (512, 512, 512, 512, 1536)
    enc_kernel_sizes: tuple[int, ...] = (5, 3, 3, 3, 1)
    enc_dilations: tuple[int, ...] = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = 24000


@dataclass(frozen=True)
class ModelConfig:
    """The whole CustomVoice model plus the text-side special token ids."""

    talker: TalkerConfig = field(default_factory=TalkerConfig)
    code_predictor: CodePredictorConfig = field(default_factory=CodePredictorConfig)
    speech_decoder: SpeechDecoderConfig = field(default_factory=SpeechDecoderConfig)
    # Parsed for every type, as the official config does; built only for Base.
    speaker_encoder: SpeakerEncoderConfig = field(default_factory=SpeakerEncoderConfig)
    # The speech tokenizer's encoder (reference codes); built only for Base too.
    speech_encoder: SpeechEncoderConfig = field(default_factory=SpeechEncoderConfig)
    tts_model_size: str = "0b6"
    tts_model_type: ModelType = ModelType.CUSTOM_VOICE  # a str is parsed (ValueError)
    im_start_token_id: int = 151644
    im_end_token_id: int = 151645
    tts_pad_token_id: int = 151671
    tts_bos_token_id: int = 151672
    tts_eos_token_id: int = 151673
    name: str = "custom"

    def __post_init__(self) -> None:
        # config.json's string (or a ModelType) -> a ModelType; ValueError if unknown
        object.__setattr__(self, "tts_model_type", ModelType.parse(self.tts_model_type))

    @property
    def can_clone(self) -> bool:
        """Builds the speaker (and speech) encoder: voices from reference audio."""
        return self.tts_model_type == ModelType.BASE

    @property
    def supports_instruct(self) -> bool:
        # The official wrapper tests `tts_model_size in "0b6"` (a substring test) and drops
        # the instruction for the 0.6B model; we keep the same rule.
        return self.tts_model_size not in "0b6"

    @classmethod
    def from_name(cls, name: str) -> ModelConfig:
        try:
            return PRESETS[name]
        except KeyError:
            raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}") from None

    # --- the official config.json -----------------------------------------------------

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any], speech_cfg: dict[str, Any] | None,
                     name: str = "checkpoint") -> ModelConfig:
        t = dict(cfg.get("talker_config", {}))
        cp = dict(t.pop("code_predictor_config", {}) or {})
        rope = t.get("rope_scaling") or {}
        if cfg.get("tts_model_type", ModelType.CUSTOM_VOICE) != ModelType.CUSTOM_VOICE:
            # Base / VoiceDesign have no preset speakers: never default to ours.
            t.setdefault("spk_id", {})
            t.setdefault("spk_is_dialect", {})
        talker = _pick(TalkerConfig, t, mrope_section=tuple(rope.get("mrope_section",
                                                                    (24, 20, 20))),
                       mrope_interleaved=bool(rope.get("interleaved", False)))
        speaker_encoder = _pick(SpeakerEncoderConfig, cfg.get("speaker_encoder_config") or {})
        code_predictor = _pick(CodePredictorConfig, cp)
        dec = dict((speech_cfg or {}).get("decoder_config", {}))
        speech = _pick(SpeechDecoderConfig, dec,
                       sample_rate=int((speech_cfg or {}).get("output_sample_rate", 24000)))
        if speech_cfg and "head_dim" not in dec:
            speech = dataclasses.replace(
                speech, head_dim=speech.hidden_size // speech.num_attention_heads)
        top = {k: cfg[k] for k in ("tts_model_size", "tts_model_type", "im_start_token_id",
                                   "im_end_token_id", "tts_pad_token_id", "tts_bos_token_id",
                                   "tts_eos_token_id") if cfg.get(k) is not None}
        speech_encoder = SpeechEncoderConfig.from_hf(speech_cfg or {})
        return cls(talker=talker, code_predictor=code_predictor, speech_decoder=speech,
                   speaker_encoder=speaker_encoder, speech_encoder=speech_encoder, name=name,
                   **top)

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        cfg = json.loads((path / "config.json").read_text())
        ModelType.parse(cfg.get("tts_model_type") or ModelType.CUSTOM_VOICE, str(path))
        speech_path = path / "speech_tokenizer" / "config.json"
        speech = json.loads(speech_path.read_text()) if speech_path.exists() else None
        return cls.from_hf_dict(cfg, speech, name=path.name)

    def to_hf_dict(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(config.json, speech_tokenizer/config.json) as the official code reads them."""
        t = dataclasses.asdict(self.talker)
        section, interleaved = t.pop("mrope_section"), t.pop("mrope_interleaved")
        t["rope_scaling"] = {"mrope_section": list(section), "interleaved": interleaved,
                             "rope_type": "default", "type": "default"}
        t["code_predictor_config"] = dataclasses.asdict(self.code_predictor)
        cfg = {
            "architectures": ["Qwen3TTSForConditionalGeneration"], "model_type": "qwen3_tts",
            "talker_config": t, "tokenizer_type": "qwen3_tts_tokenizer_12hz",
            "speaker_encoder_config": {k: list(v) if isinstance(v, tuple) else v for k, v in
                                       dataclasses.asdict(self.speaker_encoder).items()},
            "tts_model_size": self.tts_model_size, "tts_model_type": self.tts_model_type,
            "im_start_token_id": self.im_start_token_id, "im_end_token_id": self.im_end_token_id,
            "tts_pad_token_id": self.tts_pad_token_id, "tts_bos_token_id": self.tts_bos_token_id,
            "tts_eos_token_id": self.tts_eos_token_id,
        }
        d = dataclasses.asdict(self.speech_decoder)
        sample_rate = d.pop("sample_rate")
        d["upsample_rates"], d["upsampling_ratios"] = list(d["upsample_rates"]), list(
            d["upsampling_ratios"])
        speech = {
            "architectures": ["Qwen3TTSTokenizerV2Model"], "model_type": "qwen3_tts_tokenizer_12hz",
            "decoder_config": d, "encoder_config": self.speech_encoder.to_hf(),
            "encoder_valid_num_quantizers": self.speech_encoder.valid_num_quantizers,
            "input_sample_rate": self.speech_encoder.sampling_rate,
            "output_sample_rate": sample_rate,
            "decode_upsample_rate": self.speech_decoder.frame_samples,
            "encode_downsample_rate": self.speech_encoder.frame_samples,
        }
        return cfg, speech


def _pick(cls: type, src: dict[str, Any], **overrides: Any) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in src.items() if k in names}
    for k, v in list(kwargs.items()):
        if isinstance(v, list):
            kwargs[k] = tuple(v)
    kwargs.update(overrides)
    return cls(**kwargs)


def _tiny(talker_hidden: int, size: str, name: str) -> ModelConfig:
    # head_dim 16 with 2 KV heads; mrope sections sum to head_dim // 2 like the real (24+20+20).
    return ModelConfig(
        talker=TalkerConfig(hidden_size=talker_hidden, num_hidden_layers=2,
                            intermediate_size=2 * talker_hidden, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=16, text_hidden_size=32,
                            mrope_section=(4, 2, 2), max_position_embeddings=4096),
        code_predictor=CodePredictorConfig(hidden_size=64, num_hidden_layers=2,
                                           intermediate_size=128, num_attention_heads=4,
                                           num_key_value_heads=2, head_dim=16,
                                           max_position_embeddings=4096),
        speech_decoder=SpeechDecoderConfig(codebook_dim=64, hidden_size=64, latent_dim=64,
                                           num_hidden_layers=2, num_attention_heads=4,
                                           num_key_value_heads=4, head_dim=16,
                                           intermediate_size=128, decoder_dim=64),
        # A narrow Mimi encoder (same hops and codebook count as the real one); the unused
        # upsample conv the official code still builds needs groups <= hidden (32).
        speech_encoder=SpeechEncoderConfig(hidden_size=32, num_filters=8, num_hidden_layers=1,
                                           num_attention_heads=2, num_key_value_heads=2,
                                           head_dim=16, intermediate_size=64, codebook_dim=16,
                                           vector_quantization_hidden_dimension=16,
                                           upsample_groups=32),
        tts_model_size=size, name=name,
    )


def _of_type(cfg: ModelConfig, model_type: ModelType, name: str, tiny: bool) -> ModelConfig:
    """`cfg` as a Base or VoiceDesign model: no preset speakers; Base gets a speaker encoder
    whose x-vector width is the talker's hidden size (tiny: narrow channels, still
    divisible by the Res2Net scale 8)."""
    hidden = cfg.talker.hidden_size
    enc = (SpeakerEncoderConfig(enc_dim=hidden, enc_channels=(32, 32, 32, 32, 96),
                                enc_attention_channels=16, enc_se_channels=16) if tiny
           else SpeakerEncoderConfig(enc_dim=hidden))
    talker = dataclasses.replace(cfg.talker, spk_id={}, spk_is_dialect={})
    return dataclasses.replace(cfg, talker=talker, speaker_encoder=enc, tts_model_type=model_type,
                               name=name)


_1B7_TALKER = TalkerConfig(hidden_size=2048, intermediate_size=6144)

PRESETS: dict[str, ModelConfig] = {
    # Shaped like 0.6B: talker hidden == code predictor hidden (no projection).
    "tiny": _tiny(64, "0b6", "tiny"),
    # Shaped like 1.7B: talker hidden 2x the code predictor's (small_to_mtp_projection).
    "tiny-1.7b": _tiny(128, "1b7", "tiny-1.7b"),
    "0.6b": ModelConfig(tts_model_size="0b6", name="0.6b"),
    "1.7b": ModelConfig(talker=_1B7_TALKER, tts_model_size="1b7", name="1.7b"),
}
# Base (voice clone: speaker encoder) and VoiceDesign (1.7B only; no speaker encoder).
PRESETS |= {
    "tiny-base": _of_type(PRESETS["tiny"], ModelType.BASE, "tiny-base", tiny=True),
    "tiny-1.7b-base": _of_type(PRESETS["tiny-1.7b"], ModelType.BASE, "tiny-1.7b-base",
                               tiny=True),
    "tiny-1.7b-design": _of_type(PRESETS["tiny-1.7b"], ModelType.VOICE_DESIGN,
                                 "tiny-1.7b-design", tiny=True),
    "0.6b-base": _of_type(PRESETS["0.6b"], ModelType.BASE, "0.6b-base", tiny=False),
    "1.7b-base": _of_type(PRESETS["1.7b"], ModelType.BASE, "1.7b-base", tiny=False),
    "1.7b-design": _of_type(PRESETS["1.7b"], ModelType.VOICE_DESIGN, "1.7b-design", tiny=False),
}
# The stack's CPU default (`make up`'s mesh, compose's cpu profile): tiny's preset speakers
# and tiny-base's encoders in one random-weight model, so the agent's preset voice and the
# README's cloned voice both work on the stack `make up` starts. No real checkpoint does
# both: a CustomVoice checkpoint serves presets, a Base one clones.
