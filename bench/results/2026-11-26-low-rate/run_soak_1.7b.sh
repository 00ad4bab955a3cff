#!/usr/bin/env bash
# Issue 35: the 300 s soak at the 1.7B's highest rate (50 req/s, 512 open streams, 1024 KV
# rows, 4 frames a message, STOP/RESET/cancel at the soak's default shares).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/services/tts/src:$PWD/libs/voice-keys/src:$PWD:/tmp/site PYTHONUNBUFFERED=1
t0=$(date +%s)
TTS_MAX_SEQ_LEN=1024 timeout -k 15 560 python3 -m bench.soak --start-server --model preset:1.7b --device cuda \
  --max-sessions 512 --rate ${RATE:-50} --duration ${DUR:-300} --procs 4 --frames-per-message 4 \
  --deadline 520 --gate-capacity --out $OUT/soak_1.7b.json --server-log $OUT/soak_server_1.7b.log \
  2>&1 >/dev/null | tail -25 | cut -c1-400
gzip -f $OUT/soak_server_1.7b.log
echo "t=$(( $(date +%s) - t0 ))s"
