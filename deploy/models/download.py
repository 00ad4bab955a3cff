"""The model-download job: fetch each repo once into $MODELS_DIR/<name>, then exit.

Usage: python deploy/models/download.py (no arguments; -h prints this).

compose.yaml runs it before tts and llm (`service_completed_successfully`), so the GPU
services never touch the network: they read /models read-only. A marker file
(`.voice-complete`, holding the repo id) makes a second run a no-op and a changed repo
id a fresh download; an interrupted download has no marker and resumes.

Env (each empty = skip; compose.yaml and deploy/k8s/models.yaml set the defaults):
  TTS_HF_REPO         -> /models/tts         a CustomVoice checkpoint (the preset voices)
  TTS_BASE_HF_REPO    -> /models/tts-base    a Base checkpoint (clones)
  TTS_DESIGN_HF_REPO  -> /models/tts-design  a VoiceDesign checkpoint (voices made from a
                         description; the only one: Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign)
  LLM_HF_REPO         -> /models/thinker
HF_TOKEN for gated repos (read by huggingface_hub itself), MODELS_DIR (default /models).
The TTS server loads the directories its TTS_MODEL names (comma-separated), one of each
kind, and routes each call by its voice.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

MARKER = ".voice-complete"
TARGETS = {"tts": "TTS_HF_REPO", "tts-base": "TTS_BASE_HF_REPO",
           "tts-design": "TTS_DESIGN_HF_REPO", "thinker": "LLM_HF_REPO"}
# owner/name, optionally @revision
REPO_RE = re.compile(r"^[\w.-]+/[\w.-]+(@[\w./-]+)?$")


def plan(env: dict[str, str], models_dir: Path) -> list[tuple[str, str | None, Path]]:
    """(repo, revision, destination) for each target still to fetch; raises on a bad id."""
    todo = []
    for name, var in TARGETS.items():
        spec = env.get(var, "").strip()
        if not spec:
            continue
        if not REPO_RE.match(spec):
            raise ValueError(f"{var}={spec!r} is not a Hugging Face repo id (owner/name[@rev])")
        dest = models_dir / name
        marker = dest / MARKER
        if marker.is_file() and marker.read_text().strip() == spec:
            print(f"{name}: {spec} already in {dest}", flush=True)
            continue
        repo, _, rev = spec.partition("@")
        todo.append((repo, rev or None, dest))
    return todo


def main() -> int:
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__)
        return 0
    models_dir = Path(os.environ.get("MODELS_DIR", "/models"))
    try:
        todo = plan(dict(os.environ), models_dir)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not todo:
        return 0
    from huggingface_hub import snapshot_download  # only when there is work to do

    for repo, rev, dest in todo:
        print(f"downloading {repo} -> {dest}", flush=True)
        dest.mkdir(parents=True, exist_ok=True)
        (dest / MARKER).unlink(missing_ok=True)
        snapshot_download(repo_id=repo, revision=rev, local_dir=dest)
        (dest / MARKER).write_text(repo + (f"@{rev}" if rev else "") + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
