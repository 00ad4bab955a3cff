"""Keep the compose `.env` made from `.env.example`: `python3 deploy/dotenv.py [ROOT]`.

- No `.env`: write it from `.env.example` with a random LIVEKIT_API_SECRET (the example's
  is public: anyone could sign LiveKit tokens with it) and a random VOICE_API_KEY.
- A `.env` without some variable a newer `.env.example` has: append those lines (its
  default), so an update never leaves compose a variable unset; the others are kept.
- A `.env` that still holds a set of defaults an older `.env.example` shipped together
  (`RETIRED`), never edited: that set moves to today's values as a whole; one edited keeps
  its values, with a note on stderr of what it misses.
- A `.env` that still holds the example's secret: a warning on stderr, nothing changed.
- The caps STACK_CONVERSATIONS gives (deploy/sizing.py) rewritten from it, each change said.
"""

from __future__ import annotations

import re
import secrets
import sys
from pathlib import Path

from sizing import VAR as SIZE_VAR
from sizing import caps

SECRET_VAR = "LIVEKIT_API_SECRET"
KEY_VAR = "VOICE_API_KEY"  # the TTS's and the thinker's API key (compose)
_VAR = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
# Defaults that older .env.examples shipped together, and what keeping them means. A set
# moves only whole: the TTS's second checkpoint alone, at the old 32 sessions and 12G,
# would not fit its memory cap (services/tts/README.md, "Several checkpoints").
RETIRED = [
    ({"TTS_MODEL": "/models/tts", "TTS_MAX_SESSIONS": "32",
      "TTS_MPS_PINNED_DEVICE_MEM_LIMIT": "0=12G"},
     "the gpu stack's TTS serves presets only, no cloned voices"),
]


def variables(text: str) -> dict[str, str]:
    return {m[1]: m[2] for line in text.splitlines() if (m := _VAR.match(line))}


def sync(root: Path) -> list[str]:
    """Bring `root/.env` up to date; returns what it did, one line each."""
    example_text = (root / ".env.example").read_text()
    example = variables(example_text)
    env = root / ".env"
    if not env.exists():
        text = re.sub(rf"^{SECRET_VAR}=.*$", f"{SECRET_VAR}={secrets.token_hex(32)}",
                      example_text, flags=re.M)
        text = re.sub(rf"^{KEY_VAR}=.*$", f"{KEY_VAR}={secrets.token_urlsafe(32)}", text,
                      flags=re.M)
        env.write_text(text)
        env.chmod(0o600)
        return [f"wrote .env (from .env.example, with a random {SECRET_VAR} and {KEY_VAR})",
                *_size(env)]
    have = variables(env.read_text())
    done = _retired(env, have, example)
    missing = [k for k in example if k not in have]
    if missing:
        with env.open("a") as f:
            f.write("\n# added by make up from a newer .env.example\n")
            f.writelines(f"{k}={example[k]}\n" for k in missing)
        done.append(f"added to .env from .env.example: {', '.join(missing)}")
    done += _size(env)
    if have.get(SECRET_VAR) == example.get(SECRET_VAR):
        print(f"up: warning: .env has .env.example's public {SECRET_VAR}; anyone who can "
              "reach LiveKit or the token service can sign tokens with it. Set your own "
              "(openssl rand -hex 32).", file=sys.stderr)
    return done


def _size(env: Path) -> list[str]:
    """The caps of the .env's STACK_CONVERSATIONS (and its TTS_MODEL's checkpoints) in it."""
    have = variables(env.read_text())
    raw = have.get(SIZE_VAR, "")
    try:
        want = caps(int(raw), len(have.get("TTS_MODEL", "").split(","))).compose_env()
    except ValueError:
        raise SystemExit(f"up: .env has {SIZE_VAR}={raw!r}: expected the number of "
                         "conversations the stack takes at once, e.g. 64") from None
    changed = {k: v for k, v in want.items() if have.get(k) != v}
    if not changed:
        return []
    text = env.read_text()
    for k, v in changed.items():
        text = re.sub(rf"^{k}=.*$", lambda _m, k=k, v=v: f"{k}={v}", text, flags=re.M)
    env.write_text(text)
    return [f"sized .env for {SIZE_VAR}={raw}: " + ", ".join(
        f"{k}={v} (was {have.get(k)})" for k, v in changed.items())]


def _retired(env: Path, have: dict[str, str], example: dict[str, str]) -> list[str]:
    sized = set(caps(1).compose_env())  # follow STACK_CONVERSATIONS, whatever was kept
    done = []
    for old, meaning in RETIRED:
        new = {k: example[k] for k in old if k in example}
        if new == old or len(new) < len(old):
            continue
        if all(have.get(k) == v for k, v in old.items()):
            text = env.read_text()
            for k, v in new.items():
                text = re.sub(rf"^{k}=.*$", lambda _m, k=k, v=v: f"{k}={v}", text, flags=re.M)
            env.write_text(text)
            done.append("updated .env's older defaults to .env.example's: " + ", ".join(
                f"{k}={new[k]} (was {v})" for k, v in old.items()))
        elif sum(have.get(k) == v for k, v in old.items()) >= 2:  # an old .env, edited
            kept = ", ".join(f"{k}={have.get(k)}" for k in old if k not in sized)
            print(f"up: note: .env keeps {kept}, edited from an older default: {meaning}. "
                  f".env.example has {', '.join(f'{k}={v}' for k, v in new.items())}.",
                  file=sys.stderr)
    return done


def main() -> None:
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__)
        return
    for line in sync(Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd()):
        print(f"up: {line}")


if __name__ == "__main__":
    main()
