#!/usr/bin/env bash
# `make test-compose`: the cpu profile built from this checkout and run by the real Docker
# Compose v2, then checked from outside as a user would (tests/compose/test_stack.py).
#
#   1. a Docker engine and Compose v2 (`make images-local` installs and starts them when
#      missing, as root); an engine started here is stopped at the end, so that it does not
#      turn the next `make up` into compose;
#   2. base images: the ones .env.example names when present or pullable, else the local
#      Debian ones `make images-local` builds (this machine reaches no registry), as
#      `make up` does (deploy/compose-images.sh);
#   3. build inputs (deploy/docker/inputs/): the CA bundle pip trusts here and the CPU
#      torch wheel from pip's find-links, when this host's pip is set up that way;
#   4. `docker compose build` (the legacy builder unless buildx is there), then pytest.
# The optional services run when their images can be had: Prometheus always (images-local
# makes one), LiveKit and Grafana never from here; without LiveKit the page talks to the
# agent's WebSocket, and the test drives it in headless Chromium.
#
# `run.sh build` stops once the images are built, `run.sh check` skips that build (the
# images are there) and runs the checks; no argument: both. .ci/suites.py runs the two
# apart, so that a cold machine's build is timed against its own budget.
set -euo pipefail
cd "$(dirname "$0")/../.."
phase=${1:-all}
case $phase in
  all|build|check) ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: $0 [build|check]" >&2; exit 2 ;;
esac
t0=$SECONDS
say() { echo "test-compose: $*"; }

# --- 1. engine and Compose ------------------------------------------------------------
started_engine=0
if ! docker info >/dev/null 2>&1; then started_engine=1; fi
if [ $started_engine = 1 ] || ! docker compose version >/dev/null 2>&1; then
  bash deploy/images-local.sh --engine
fi
if [ $started_engine = 1 ]; then
  trap 'bash deploy/images-local.sh --stop-engine' EXIT
fi
docker buildx version >/dev/null 2>&1 || export DOCKER_BUILDKIT=0 COMPOSE_DOCKER_CLI_BUILD=0

# --- 2. images --------------------------------------------------------------------------
# shellcheck source=../../deploy/compose-images.sh
SAY=test-compose ENV_FILE=.env.example
source deploy/compose-images.sh
compose_bases || exit 1
compose_optional cpu
case " ${OPTIONAL_PROFILES[*]} " in *" prometheus "*) ;; *)
  bash deploy/images-local.sh >/dev/null
  export PROMETHEUS_IMAGE=$LOCAL_PREFIX/prometheus:$LOCAL_SUITE;;
esac
export PROMETHEUS_IMAGE=${PROMETHEUS_IMAGE:-$(compose_value PROMETHEUS_IMAGE)}
optional=()
for p in "${OPTIONAL_PROFILES[@]}"; do
  case $p in livekit|grafana) optional+=("$p") ;; esac
done
export VOICE_TEST_OPTIONAL="${optional[*]}"

# --- 3. build inputs --------------------------------------------------------------------
compose_inputs

# --- 4. build, then the checks ---------------------------------------------------------
say "bases: PYTHON_IMAGE=$PYTHON_IMAGE NODE_IMAGE=$NODE_IMAGE PROMETHEUS_IMAGE=$PROMETHEUS_IMAGE"
if [ "$phase" != check ]; then
  say "building the cpu profile images (log: .run/compose-build.log)"
  mkdir -p .run
  b0=$SECONDS
  if ! docker compose --env-file .env.example --profile cpu build >.run/compose-build.log 2>&1; then
    tail -40 .run/compose-build.log
    say "build failed"
    exit 1
  fi
  say "built in $((SECONDS - b0)) s"
  [ "$phase" = build ] && exit 0
fi
rc=0
VOICE_TEST_COMPOSE=1 .venv/tools/bin/python -m pytest -v -s -p no:cacheprovider tests/compose || rc=$?
say "$([ $rc -eq 0 ] && echo passed || echo FAILED) in $((SECONDS - t0)) s"
exit $rc
