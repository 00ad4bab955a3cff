#!/usr/bin/env bash
# `make up`: Docker Compose when a Docker engine is reachable (gpu profile when the NVIDIA
# runtime is there, else cpu); otherwise the local mesh (deploy/local/mesh.py).
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  [ -f .env ] || cp .env.example .env
  if docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q nvidia; then
    profile=gpu; why="NVIDIA runtime found"
  else
    profile=cpu; why="no NVIDIA runtime: tiny random models"
  fi
  echo "up: Docker engine reachable -> docker compose (profile $profile; $why)"
  exec docker compose --profile "$profile" up --build
fi
if command -v docker >/dev/null 2>&1; then
  echo "up: docker client found but no engine answers -> local mesh"
else
  echo "up: no Docker -> local mesh"
fi
make --no-print-directory venvs-mesh
exec "${PYTHON:-python3}" deploy/local/mesh.py up
