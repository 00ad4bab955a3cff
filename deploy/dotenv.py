"""Keep the compose `.env` made from `.env.example`: `python3 deploy/dotenv.py [ROOT]`.

- No `.env`: write it from `.env.example` with a random LIVEKIT_API_SECRET (the example's
  is public: anyone could sign LiveKit tokens with it) and a random VOICE_API_KEY.
- A `.env` without some variable a newer `.env.example` has: append those lines (its
  default), so an update never leaves compose a variable unset; the others are kept.
- A `.env` that still holds the example's secret: a warning on stderr, nothing changed.
"""

from __future__ import annotations

import re
import secrets
import sys
from pathlib import Path

SECRET_VAR = "LIVEKIT_API_SECRET"
KEY_VAR = "VOICE_API_KEY"  # the TTS's and the thinker's API key (compose)
_VAR = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


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
        return [f"wrote .env (from .env.example, with a random {SECRET_VAR} and {KEY_VAR})"]
    have = variables(env.read_text())
    done = []
    missing = [k for k in example if k not in have]
    if missing:
        with env.open("a") as f:
            f.write("\n# added by make up from a newer .env.example\n")
            f.writelines(f"{k}={example[k]}\n" for k in missing)
        done.append(f"added to .env from .env.example: {', '.join(missing)}")
    if have.get(SECRET_VAR) == example.get(SECRET_VAR):
        print(f"up: warning: .env has .env.example's public {SECRET_VAR}; anyone who can "
              "reach LiveKit or the token service can sign tokens with it. Set your own "
              "(openssl rand -hex 32).", file=sys.stderr)
    return done


def main() -> None:
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__)
        return
    for line in sync(Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd()):
        print(f"up: {line}")


if __name__ == "__main__":
    main()
