#!/usr/bin/env bash
# What the token service needs outside PyPI, idempotent and fast when done:
#   run   the page's JS bundle (npm: livekit-client + esbuild), built by web/build.sh;
#   test  (the default) that, and Debian's chromium, which the page tests drive with
#         playwright (no browser download).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
what=${1:-test}
if [ "$what" = test ] && ! command -v chromium >/dev/null 2>&1; then
  echo "token: apt-get install chromium (the page tests' browser; about a minute)"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    chromium fonts-dejavu-core >/dev/null
fi
bash "$here/web/build.sh"
