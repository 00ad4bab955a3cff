#!/usr/bin/env bash
# What the token service's tests need outside PyPI, idempotent and fast when done:
#   - Debian's chromium (the page test drives it with playwright; no browser download),
#   - the page's JS bundle (npm: livekit-client + esbuild), built by web/build.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v chromium >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    chromium fonts-dejavu-core >/dev/null
fi
bash "$here/web/build.sh"
