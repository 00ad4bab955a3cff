#!/usr/bin/env bash
# `make test-compose`: the cpu profile built from this checkout and run by the real Docker
# Compose v2, then checked from outside as a user would (tests/compose/test_stack.py).
#
#   1. a Docker engine and Compose v2 (`make images-local` installs and starts them when
#      missing, as root);
#   2. base images: the ones .env.example names when present or pullable, else the local
#      Debian ones `make images-local` builds (this machine reaches no registry);
#   3. build inputs (deploy/docker/inputs/): the CA bundle pip trusts here and the CPU
#      torch wheel from pip's find-links, when this host's pip is set up that way;
#   4. `docker compose build` (the legacy builder unless buildx is there), then pytest.
# LiveKit and Grafana run only when their images can be had (never from here).
set -euo pipefail
cd "$(dirname "$0")/../.."
t0=$SECONDS
say() { echo "test-compose: $*"; }
env_default() { sed -n "s/^$1=//p" .env.example; }

# --- 1. engine and Compose ------------------------------------------------------------
if ! docker info >/dev/null 2>&1 || ! docker compose version >/dev/null 2>&1; then
  bash deploy/images-local.sh
fi
docker buildx version >/dev/null 2>&1 || export DOCKER_BUILDKIT=0 COMPOSE_DOCKER_CLI_BUILD=0

# --- 2. images --------------------------------------------------------------------------
have_image() {
  docker image inspect "$1" >/dev/null 2>&1 || timeout 300 docker pull -q "$1" >/dev/null 2>&1
}
for var in PYTHON_IMAGE NODE_IMAGE PROMETHEUS_IMAGE; do
  image=${!var:-$(env_default "$var")}
  if ! have_image "$image"; then
    say "$var=$image cannot be had: using the local Debian images (make images-local)"
    bash deploy/images-local.sh >/dev/null
    export PYTHON_IMAGE=voice-local/python:bookworm NODE_IMAGE=voice-local/node:bookworm \
      PROMETHEUS_IMAGE=voice-local/prometheus:bookworm
    break
  fi
  export "$var=$image"
done
optional=()
for var in LIVEKIT_IMAGE GRAFANA_IMAGE; do
  image=${!var:-$(env_default "$var")}
  if have_image "$image"; then
    optional+=("${var%_IMAGE}")
  else
    say "not run: ${var%_IMAGE} ($image is not here and no registry serves it)"
  fi
done
export VOICE_TEST_OPTIONAL="${optional[*]}"

# --- 3. build inputs --------------------------------------------------------------------
inputs=deploy/docker/inputs
ca=${PIP_CERT:-$(pip config get global.cert 2>/dev/null || true)}
if [ -n "$ca" ] && [ -f "$ca" ]; then
  mkdir -p "$inputs/ca" && cp "$ca" "$inputs/ca/host.crt"
  say "build input: the CA bundle pip trusts here ($ca)"
fi
torch_version=${TORCH_VERSION:-$(env_default TORCH_VERSION)}
for dir in ${PIP_FIND_LINKS:-$(pip config get global.find-links 2>/dev/null || true)}; do
  for whl in "$dir"/torch-"$torch_version"+cpu-cp311-*.whl; do
    [ -f "$whl" ] || continue
    mkdir -p "$inputs/wheels"
    [ -f "$inputs/wheels/$(basename "$whl")" ] || cp "$whl" "$inputs/wheels/"
    # The PyTorch CPU index is not needed (nor reachable here): the wheel is local.
    export TORCH_CPU_INDEX_URL=""
    say "build input: $(basename "$whl")"
  done
done

# --- 4. build, then the checks ---------------------------------------------------------
say "bases: PYTHON_IMAGE=$PYTHON_IMAGE NODE_IMAGE=$NODE_IMAGE PROMETHEUS_IMAGE=$PROMETHEUS_IMAGE"
say "building the cpu profile images (log: .run/compose-build.log)"
mkdir -p .run
b0=$SECONDS
if ! docker compose --env-file .env.example --profile cpu build >.run/compose-build.log 2>&1; then
  tail -40 .run/compose-build.log
  say "build failed"
  exit 1
fi
say "built in $((SECONDS - b0)) s"
rc=0
VOICE_TEST_COMPOSE=1 .venv/tools/bin/python -m pytest -v -s -p no:cacheprovider tests/compose || rc=$?
say "$([ $rc -eq 0 ] && echo passed || echo FAILED) in $((SECONDS - t0)) s"
exit $rc
