#!/usr/bin/env bash
# `make down`: stop what `make up` started (the local mesh, or the compose stack), and say
# what it did: nothing running, or stopped and which named volumes it kept.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f "${MESH_RUN_DIR:-.run}/mesh.json" ]; then
  exec "${PYTHON:-python3}" deploy/local/mesh.py down
fi
if [ "${VOICE_UP:-auto}" != mesh ] && command -v docker >/dev/null 2>&1 \
    && docker info >/dev/null 2>&1 && docker compose version >/dev/null 2>&1; then
  # Every profile, the optional ones too, so whatever `make up` chose is stopped.
  compose=(docker compose --profile gpu --profile cpu --profile livekit --profile prometheus
           --profile grafana --profile dcgm)
  if [ -z "$("${compose[@]}" ps -aq 2>/dev/null)" ]; then
    echo "down: nothing running (no mesh, no containers of the compose project)"
    exit 0
  fi
  "${compose[@]}" down
  # Named volumes outlive `down` on purpose: fetched weights, cloned voices, metrics.
  kept=$("${compose[@]}" config --volumes 2>/dev/null || true)
  echo "down: stopped; kept the volumes ${kept//$'\n'/ } (\`docker compose down -v\`" \
    "deletes them: fetched weights, cloned voices, metrics history)"
  exit 0
fi
echo "down: nothing running"
