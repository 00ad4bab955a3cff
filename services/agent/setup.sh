#!/usr/bin/env bash
# System packages of the agent, idempotent: returns at once when installed.
#   run   nothing: the agent runs on its venv alone;
#   test  (the default) espeak-ng (real speech for the VAD/STT path), flite (a second
#         synthesizer family for bench/turn_set.py) and sox.
set -euo pipefail
[ "${1:-test}" = run ] && exit 0
need=()
command -v espeak-ng >/dev/null 2>&1 || need+=(espeak-ng)
command -v flite >/dev/null 2>&1 || need+=(flite)
command -v sox >/dev/null 2>&1 || need+=(sox)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
echo "agent: apt-get install ${need[*]} (speech for the tests)"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
