"""Every AUTORTC_* knob, read from the environment in one place (CLI flags override).

The agent's own knobs stay AGENT_* (the direct transport builds the agent's settings
from the environment exactly as `python -m voice_agent` would); LIVEKIT_* are the SDK
names, shared with the token service and the agent.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

_REPO = Path(__file__).resolve().parents[4]  # services/autortc/src/voice_autortc -> repo


def _venv_python(name: str) -> str:
    return str(_REPO / ".venv" / name / "bin" / "python")


class AutoRTCSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AUTORTC_", extra="ignore", frozen=True)

    # Where run directories go (one per run, named by the run's trace id).
    output_root: Path = Path(".run/autortc")  # .run/ is git-ignored
    # Python of the TTS / thinker venvs, for --spawn-backends (they carry torch).
    tts_python: str = Field(default_factory=lambda: _venv_python("tts"))
    llm_python: str = Field(default_factory=lambda: _venv_python("llm"))
    # Seconds to wait for a spawned backend's /healthz (the tiny models build at start).
    backend_start_timeout_s: float = Field(300.0, gt=0)
    # Case-level retries when the capture is NO_REPLY / POST_SILENT (seed 003 13.2).
    retries: int = Field(1, ge=0, le=5)
    # The agent greets at session start (the greeting stays out of the reply slice).
    greet: bool = True
    # Audible threshold of a reply (seed 003 13.3: rms >= 0.01).
    valid_rms: float = Field(0.01, gt=0, lt=1)

    # --- livekit transport ---------------------------------------------------------
    livekit_url: str = Field("", validation_alias="LIVEKIT_URL")
    livekit_api_key: str = Field("", validation_alias="LIVEKIT_API_KEY")
    livekit_api_secret: str = Field("", validation_alias="LIVEKIT_API_SECRET")
    # Room name prefix: the agent's dispatch must match it (seed 003 14.5).
    room_prefix: str = "autortc"
    # Extra recording after the reply_end mark / the energy end of the reply.
    record_pad_s: float = Field(10.0, ge=0, le=120)
    # Where the agent writes pre_rtc/<trace_id>/pre_rtc.wav ("" = no Ring1 on livekit).
    pre_rtc_dir: str = ""


def load_settings(**overrides: object) -> AutoRTCSettings:
    try:
        return AutoRTCSettings(**overrides)  # type: ignore[arg-type]
    except ValidationError as e:
        lines = [f"  AUTORTC_{'.'.join(str(x) for x in err['loc']).upper()}: {err['msg']}"
                 for err in e.errors()]
        raise SystemExit("bad autortc configuration:\n" + "\n".join(lines)) from None
