#!/usr/bin/env bash
# System packages AutoRTC needs: espeak-ng (the users' speech of every case) and sox.
# Idempotent: returns at once when both are installed.
set -euo pipefail
need=()
command -v espeak-ng >/dev/null 2>&1 || need+=(espeak-ng)
command -v sox >/dev/null 2>&1 || need+=(sox)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
