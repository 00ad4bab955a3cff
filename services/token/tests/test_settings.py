"""Configuration from the environment: defaults, secret files, and every bad value fails
at start-up with a message naming the variable and never containing the secret."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import API_KEY, API_SECRET
from voice_token.settings import SettingsError, load_settings


def _creds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIVEKIT_API_KEY", API_KEY)
    monkeypatch.setenv("LIVEKIT_API_SECRET", API_SECRET)


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    _creds(monkeypatch)
    s = load_settings()
    assert s.token_http_port == 8080
    assert s.token_ttl_seconds == 600
    assert s.livekit_url == "ws://localhost:7880"
    assert s.token_cors_origins == []
    assert s.token_agent_name == ""
    assert s.token_agent_timeout_seconds == 10.0
    assert s.credentials() == (API_KEY, API_SECRET)


def test_env_values_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    _creds(monkeypatch)
    monkeypatch.setenv("TOKEN_CORS_ORIGINS", "https://a.example, http://localhost:5173/")
    monkeypatch.setenv("TOKEN_TTL_SECONDS", "900")
    monkeypatch.setenv("TOKEN_AGENT_NAME", "voice-agent")
    monkeypatch.setenv("LIVEKIT_URL", "wss://lk.example.com/")
    s = load_settings()
    assert s.token_cors_origins == ["https://a.example", "http://localhost:5173"]
    assert s.token_ttl_seconds == 900
    assert s.token_agent_name == "voice-agent"
    assert s.livekit_url == "wss://lk.example.com"


def test_secret_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "key").write_text(API_KEY + "\n")
    (tmp_path / "secret").write_text(API_SECRET + "\n")
    monkeypatch.setenv("LIVEKIT_API_KEY_FILE", str(tmp_path / "key"))
    monkeypatch.setenv("LIVEKIT_API_SECRET_FILE", str(tmp_path / "secret"))
    assert load_settings().credentials() == (API_KEY, API_SECRET)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "LIVEKIT_API_KEY (or LIVEKIT_API_KEY_FILE) is required"),
        ({"LIVEKIT_API_KEY": API_KEY}, "LIVEKIT_API_SECRET (or LIVEKIT_API_SECRET_FILE)"),
        ({"LIVEKIT_API_KEY": API_KEY, "LIVEKIT_API_SECRET": "  "}, "LIVEKIT_API_SECRET (or"),
        ({"LIVEKIT_API_KEY": API_KEY, "LIVEKIT_API_SECRET": API_SECRET,
          "LIVEKIT_API_SECRET_FILE": "/etc/hostname"}, "both LIVEKIT_API_SECRET and"),
        ({"LIVEKIT_API_KEY": API_KEY, "LIVEKIT_API_SECRET_FILE": "/nonexistent/secret"},
         "LIVEKIT_API_SECRET_FILE=/nonexistent/secret: cannot read (No such file"),
        ({"LIVEKIT_API_KEY": API_KEY, "LIVEKIT_API_SECRET": "short17"},
         "LIVEKIT_API_SECRET is 7 characters; use 32 or more"),
        ({"LIVEKIT_API_KEY": API_KEY, "LIVEKIT_API_SECRET": API_SECRET[:31]},
         "is 31 characters"),
    ],
    ids=["no-key", "no-secret", "blank-secret", "both-secret-sources", "missing-file",
         "7-char-secret", "31-char-secret"],
)
def test_credentials_errors(monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                            message: str) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SettingsError, match=None) as e:
        load_settings()
    assert message in str(e.value)
    assert API_SECRET not in str(e.value)


def test_empty_secret_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("\n")
    monkeypatch.setenv("LIVEKIT_API_KEY", API_KEY)
    monkeypatch.setenv("LIVEKIT_API_SECRET_FILE", str(tmp_path / "secret"))
    with pytest.raises(SettingsError, match="the file is empty"):
        load_settings()


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("TOKEN_TTL_SECONDS", "abc", "TOKEN_TTL_SECONDS: Input should be a valid integer"),
        ("TOKEN_TTL_SECONDS", "10", "TOKEN_TTL_SECONDS: Input should be greater than or equal"),
        ("TOKEN_TTL_SECONDS", "999999", "TOKEN_TTL_SECONDS: Input should be less than"),
        ("TOKEN_HTTP_PORT", "70000", "TOKEN_HTTP_PORT"),
        ("LIVEKIT_URL", "localhost:7880", "LIVEKIT_URL: Value error, must be a ws://"),
        ("TOKEN_CORS_ORIGINS", "example.com", "TOKEN_CORS_ORIGINS: Value error, 'example.com' is"),
        ("TOKEN_CORS_ORIGINS", "https://a.example/path", "is not an origin"),
        ("TOKEN_RATE_LIMIT_PER_MINUTE", "0", "TOKEN_RATE_LIMIT_PER_MINUTE"),
        ("TOKEN_TRUST_PROXY", "maybe", "TOKEN_TRUST_PROXY: Input should be a valid boolean"),
        ("TOKEN_LOG_LEVEL", "LOUD", "TOKEN_LOG_LEVEL: Value error, must be one of"),
        ("TOKEN_AGENT_TIMEOUT_SECONDS", "0", "TOKEN_AGENT_TIMEOUT_SECONDS: Input should be"),
    ],
)
def test_bad_values_fail_fast_without_echoing_secrets(
    monkeypatch: pytest.MonkeyPatch, var: str, value: str, message: str
) -> None:
    _creds(monkeypatch)
    monkeypatch.setenv(var, value)
    with pytest.raises(SettingsError) as e:
        load_settings()
    assert message in str(e.value)
    # pydantic's own messages echo inputs; ours never include the secret.
    assert API_SECRET not in str(e.value) and API_SECRET not in repr(e.value)


def test_repr_and_summary_hide_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    _creds(monkeypatch)
    s = load_settings()
    assert API_SECRET not in repr(s) and API_SECRET not in str(s.public_summary())
    assert s.public_summary()["LIVEKIT_API_SECRET"] == "<set>"
