#!/usr/bin/env bash
# `make down`: stop what `make up` started (compose project, or the local mesh).
set -euo pipefail
cd "$(dirname "$0")/.."
if docker info >/dev/null 2>&1 && docker compose version >/dev/null 2>&1; then
  exec docker compose --profile gpu --profile cpu down "$@"
fi
exec python3 deploy/localmesh.py down
