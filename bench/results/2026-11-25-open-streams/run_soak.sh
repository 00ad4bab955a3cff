#!/usr/bin/env bash
# Issue 35: the 300 s soak at the new highest rate (0.6B, 60 req/s, 512 open streams, 4 frames
# a message, STOP/RESET/cancel at the soak's default shares), then 1.7B open loop if time is left.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=services/tts/src:.:/tmp/site PYTHONUNBUFFERED=1
t0=$(date +%s)
TTS_MAX_SEQ_LEN=1024 timeout -k 15 470 python3 -m bench.soak --start-server --model preset:0.6b --device cuda \
  --max-sessions 512 --rate ${RATE:-60} --duration ${DUR:-300} --procs 4 --frames-per-message 4 \
  --deadline 430 --gate-capacity --out $OUT/soak_0.6b.json --server-log $OUT/soak_server_0.6b.log \
  2>&1 >/dev/null | tail -25 | cut -c1-400
gzip -f $OUT/soak_server_0.6b.log
echo "t=$(( $(date +%s) - t0 ))s"
