#!/usr/bin/env bash
# Builds the page's JS bundle: livekit-client (npm, pinned by package-lock.json) + src/*.js
# (+ the agent's talk/protocol.json)
# -> ../src/voice_token/static/dist/app.js, with esbuild. Idempotent and fast: does
# nothing when the inputs' hash matches the one recorded next to the bundle, and only
# runs `npm ci` when the lock file changed.
set -euo pipefail
cd "$(dirname "$0")"
out=../src/voice_token/static/dist
command -v npm >/dev/null 2>&1 || { echo "token/web: npm is required (node >= 18)" >&2; exit 1; }
# the /v1/talk protocol is the agent's (talk.js imports it): bundled in, so hashed too
protocol=../../agent/src/voice_agent/talk/protocol.json
inputs=$(cat package.json package-lock.json build.sh src/*.js "$protocol" | sha256sum | cut -d' ' -f1)
if [ -f "$out/app.js" ] && [ "$(cat "$out/.inputs" 2>/dev/null)" = "$inputs" ]; then
  exit 0
fi
lock=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -x node_modules/.bin/esbuild ] || [ "$(cat node_modules/.lock-hash 2>/dev/null)" != "$lock" ]; then
  echo "token/web: npm ci (livekit-client, esbuild)"
  npm ci --no-audit --no-fund --loglevel=error
  echo "$lock" > node_modules/.lock-hash
fi
mkdir -p "$out"
node_modules/.bin/esbuild src/main.js --bundle --minify --sourcemap --format=esm \
  --target=es2020 --log-level=warning --outfile="$out/app.js"
echo "$inputs" > "$out/.inputs"
echo "token/web: built $out/app.js ($(du -k "$out/app.js" | cut -f1) KiB)"
