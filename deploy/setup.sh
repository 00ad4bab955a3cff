#!/usr/bin/env bash
# System tools the deploy tests (tests/deploy) use outside PyPI, idempotent: returns at
# once when present. promtool (Debian package `prometheus`) checks prometheus.yml and
# alerts.yml and runs the alert unit tests; without it those tests skip.
# kubectl (for `kubectl kustomize`) is used when present, never installed here.
set -euo pipefail
command -v promtool >/dev/null 2>&1 && exit 0
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
# The package also ships the server; nothing starts it in a container or CI.
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
