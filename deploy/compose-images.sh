# Sourced by deploy/up.sh (`make up`) and tests/compose/run.sh (`make test-compose`): which
# images a compose run can have on this engine, and what to do about the others.
#
#   compose_bases      PYTHON_IMAGE / NODE_IMAGE, the bases of the images compose builds:
#                      the configured ones when here or pullable, else the local Debian
#                      ones `make images-local` makes (made now when missing; exported).
#                      Returns 1 when neither can be had.
#   compose_inputs     build inputs this host needs (deploy/docker/inputs/): the CA bundle
#                      pip trusts here, the CPU torch wheel from pip's find-links, the
#                      agent's Smart Turn model file from .venv/agent.
#   compose_optional   PROFILE: the optional profiles (compose.yaml) whose images are here
#                      or pullable, in OPTIONAL_PROFILES; one line per service left out.
#   compose_ports_free the core's host ports are free (else which variable to change).
#
# A variable's value: the environment's, else ENV_FILE's (default .env), else compose.yaml's
# default (the same as .env.example's). Messages go to stdout, prefixed with $SAY (default up).

LOCAL_PREFIX=${LOCAL_IMAGE_PREFIX:-voice-local}
LOCAL_SUITE=${DEBIAN_SUITE:-bookworm}

compose_value() {
  local var=$1 file=${ENV_FILE:-.env}
  if [ -n "${!var+x}" ]; then echo "${!var}"; return; fi
  if [ -f "$file" ] && grep -q "^$var=" "$file"; then sed -n "s/^$var=//p" "$file" | tail -1; return; fi
  sed -n "s/^$var=//p" .env.example
}

# Here, or pulled now (a registry answers). A failed pull says why on stderr only when asked.
have_image() {
  docker image inspect "$1" >/dev/null 2>&1 && return 0
  timeout "${PULL_TIMEOUT:-300}" docker pull -q "$1" >/dev/null 2>&1
}

compose_bases() {
  local var image missing=()
  for var in PYTHON_IMAGE NODE_IMAGE; do
    image=$(compose_value "$var")
    export "$var=$image"
    have_image "$image" || missing+=("$image")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "${SAY:-up}: ${missing[*]}: not here and this engine cannot pull them (no registry" \
    "answers): building on local Debian bases (make images-local, ~4.5 minutes on 2 cores; its" \
    "log: /tmp/voice-images-local.log; PYTHON_IMAGE and NODE_IMAGE pick others)"
  if ! bash deploy/images-local.sh >/tmp/voice-images-local.log 2>&1; then
    tail -5 /tmp/voice-images-local.log
    echo "${SAY:-up}: \`make images-local\` could not make them (log: /tmp/voice-images-local.log)"
    return 1
  fi
  export PYTHON_IMAGE=$LOCAL_PREFIX/python:$LOCAL_SUITE NODE_IMAGE=$LOCAL_PREFIX/node:$LOCAL_SUITE
  # Prometheus too, when the configured one cannot be had (images-local makes one).
  have_image "$(compose_value PROMETHEUS_IMAGE)" \
    || export PROMETHEUS_IMAGE=$LOCAL_PREFIX/prometheus:$LOCAL_SUITE
}

compose_inputs() {
  local inputs=deploy/docker/inputs ca dir whl version
  ca=${PIP_CERT:-$(pip config get global.cert 2>/dev/null || true)}
  if [ -n "$ca" ] && [ -f "$ca" ]; then
    mkdir -p "$inputs/ca" && cp "$ca" "$inputs/ca/host.crt"
    echo "${SAY:-up}: build input: the CA bundle pip trusts here ($ca)"
  fi
  # The agent's Smart Turn file as .venv/agent has it (make venvs); else fetched here from
  # the pinned pipecat-ai wheel (the image build may reach no package index).
  local turn=.venv/agent/share/voice-agent/smart-turn-v3.2-cpu.onnx
  mkdir -p "$inputs/smart-turn"
  if [ -f "$turn" ]; then
    cp "$turn" "$inputs/smart-turn/"
  elif [ ! -f "$inputs/smart-turn/$(basename "$turn")" ]; then
    python3 services/agent/src/voice_agent/smart_turn.py fetch \
      --dest "$inputs/smart-turn/$(basename "$turn")" >/dev/null || true
  fi
  [ -f "$inputs/smart-turn/$(basename "$turn")" ] && echo "${SAY:-up}: build input: $(basename "$turn")"
  version=$(compose_value TORCH_VERSION)
  for dir in ${PIP_FIND_LINKS:-$(pip config get global.find-links 2>/dev/null || true)}; do
    for whl in "$dir"/torch-"$version"+cpu-cp311-*.whl; do
      [ -f "$whl" ] || continue
      mkdir -p "$inputs/wheels"
      [ -f "$inputs/wheels/$(basename "$whl")" ] || cp "$whl" "$inputs/wheels/"
      # The PyTorch CPU index is not needed (nor reachable here): the wheel is local.
      export TORCH_CPU_INDEX_URL=""
      echo "${SAY:-up}: build input: $(basename "$whl")"
    done
  done
}

# The core's host ports (compose.yaml's port variables) are free, or say who holds one and
# what to do. Returns 1 when one is taken. Our own running project holds them: fine.
compose_ports_free() {
  local var port taken=0
  [ -z "$(docker compose ps -q 2>/dev/null)" ] || return 0
  for var in TTS_GRPC_PORT TTS_HTTP_PORT LLM_GRPC_PORT LLM_HTTP_PORT AGENT_HTTP_PORT \
      TOKEN_HTTP_PORT; do
    port=$(compose_value "$var")
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "${SAY:-up}: port $port ($var) is taken on this host: set $var=another port" \
        "(in .env or the environment), or stop what holds it" >&2
      taken=1
    fi
  done
  if [ $taken = 1 ] && [ -f "${MESH_RUN_DIR:-.run}/mesh.json" ]; then
    echo "${SAY:-up}: the local mesh is running (\`make down\` stops it)" >&2
  fi
  return $taken
}

# compose_optional PROFILE: sets OPTIONAL_PROFILES (and LIVEKIT_PUBLIC_URL with LiveKit).
compose_optional() {
  local profile=$1 image
  OPTIONAL_PROFILES=()
  left_out() { echo "${SAY:-up}: left out: $1 ($2 is not here and no registry serves it): $3"; }
  image=$(compose_value LIVEKIT_IMAGE)
  if have_image "$image"; then
    OPTIONAL_PROFILES+=(livekit)
    # The browsers' URL: set, the agent joins LiveKit and the page uses it.
    LIVEKIT_PUBLIC_URL=$(compose_value LIVEKIT_PUBLIC_URL)
    export LIVEKIT_PUBLIC_URL=${LIVEKIT_PUBLIC_URL:-ws://localhost:7880}
  else
    left_out livekit "$image" "the page talks to the agent's WebSocket instead"
    # Even if .env names a LiveKit URL: no server runs, so no worker and no LiveKit page.
    export LIVEKIT_PUBLIC_URL=""
  fi
  image=$(compose_value PROMETHEUS_IMAGE)
  if have_image "$image"; then
    OPTIONAL_PROFILES+=(prometheus)
    image=$(compose_value GRAFANA_IMAGE)
    if have_image "$image"; then
      OPTIONAL_PROFILES+=(grafana)
    else
      left_out grafana "$image" "Prometheus alone has the metrics (http://127.0.0.1:9090)"
    fi
  else
    left_out "prometheus and grafana" "$image" \
      "no metrics; \`make images-local\` builds a Prometheus image"
  fi
  if [ "$profile" = gpu ]; then
    image=$(compose_value DCGM_EXPORTER_IMAGE)
    if have_image "$image"; then OPTIONAL_PROFILES+=(dcgm); else
      left_out dcgm-exporter "$image" "no GPU metrics"; fi
  fi
}
