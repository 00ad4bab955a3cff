#!/usr/bin/env bash
# Issue 35, the low rates (H100): where the server's TTFA goes at 1 / 10 / 20 req/s (the
# FIRST_AUDIO split: queue, prefill, first packet; the session's start), with this
# commit's engine and then with the engine of $BASE (same machine, same prompts).
# Usage: BASE=<commit> MODELS="0.6b" SWITCH="0.005 0.0005" DUR=30 bash bench/results/2026-11-26-low-rate/run.sh
set -uo pipefail
. "$(dirname "$0")/lib.sh"
# SWITCH: sys.setswitchinterval for the server (a sitecustomize), e.g. "0.005 0.0005"
mkdir -p /tmp/swi && cat > /tmp/swi/sitecustomize.py <<'PY'
import os, sys
if os.environ.get("SWI"):
    sys.setswitchinterval(float(os.environ["SWI"]))
PY
for m in ${MODELS:-0.6b}; do
  for swi in ${SWITCH:-0.005}; do
    SWI=$swi PYTHONPATH=$PYTHONPATH:/tmp/swi serve $m new_${m}_$swi
    ol new_${m}_$swi ${RATES:-1,10,20} ${DUR:-30} --prompts bench/prompts/en_read_1088.txt
    kill $srv; wait $srv
  done
done
if [ -n "${BASE:-}" ]; then
  git checkout "$BASE" -- services/tts/src/voice_tts/engine || exit 1
  for m in ${MODELS:-0.6b}; do
    serve $m old_$m
    ol old_$m ${RATES:-1,10,20} ${DUR:-30} --prompts bench/prompts/en_read_1088.txt
    kill $srv; wait $srv
  done
  git checkout HEAD -- services/tts/src/voice_tts/engine
fi
gzip -f $OUT/server_*.log
