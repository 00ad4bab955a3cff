#!/usr/bin/env bash
# `make up`: the whole stack.
#   A reachable Docker engine with the compose plugin -> docker compose up (compose.yaml),
#   profile from .env (COMPOSE_PROFILES; `gpu` unless no NVIDIA GPU is visible, then `cpu`).
#   Otherwise -> the local mesh: every service from its virtualenv, tiny models
#   (deploy/localmesh.py; `make venvs` first).
set -euo pipefail
cd "$(dirname "$0")/.."

if docker info >/dev/null 2>&1 && docker compose version >/dev/null 2>&1; then
  if [ ! -f .env ]; then
    cp .env.example .env
    echo "created .env from .env.example (edit it: keys, GPU shares, model repos)"
  fi
  profile_args=()
  if [ -z "${COMPOSE_PROFILES:-}" ] && ! command -v nvidia-smi >/dev/null 2>&1; then
    # No GPU here: run the same mesh on tiny random models.
    profile_args=(--profile cpu)
    export COMPOSE_PROFILES=cpu
    echo "no nvidia-smi on this host: using the cpu profile (tiny random models)"
  fi
  exec docker compose "${profile_args[@]}" up --build --detach --wait "$@"
fi

echo "no Docker engine reachable: starting the local mesh (tiny models, CPU)"
# The Makefile's stamps build (or refresh) exactly the four virtualenvs the mesh runs.
make --no-print-directory .venv/tts/.ok .venv/llm/.ok .venv/agent/.ok .venv/token/.ok
exec python3 deploy/localmesh.py up "$@"
