#!/usr/bin/env bash
# `make down`: stop what `make up` started (the local mesh, or the compose stack).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f "${MESH_RUN_DIR:-.run}/mesh.json" ]; then
  exec "${PYTHON:-python3}" deploy/local/mesh.py down
fi
if [ "${VOICE_UP:-auto}" != mesh ] && command -v docker >/dev/null 2>&1 \
    && docker info >/dev/null 2>&1 && docker compose version >/dev/null 2>&1; then
  # Every profile, the optional ones too, so whatever `make up` chose is stopped.
  exec docker compose --profile gpu --profile cpu --profile livekit --profile prometheus \
    --profile grafana --profile dcgm down
fi
echo "down: nothing running"
