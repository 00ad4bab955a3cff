#!/usr/bin/env bash
# Issue 35 item 3 (H100, 2026-11-25): TTFA from the first word, the old step order
# (commit 7f40ca9, unpacked into old/ with `git archive 7f40ca9 services/tts/src | tar -x -C old`)
# vs the new one, open loop, 0.6B, 4 frames a message, sentences whose first word is one
# token. Run from the repository root with the server's deps on PYTHONPATH.
set -uo pipefail
run() {  # $1 src, $2 tag, $3 modes, $4 timeout
  PYTHONPATH=$1 TTS_MODEL=preset:0.6b TTS_DEVICE=cuda TTS_MAX_SESSIONS=256 TTS_GRPC_PORT=50051 TTS_HTTP_PORT=8001 \
    python3 -m voice_tts.server > $OUT/server_$2.log 2>&1 &
  srv=$!
  for _ in $(seq 120); do grep -q "TTS serving" $OUT/server_$2.log && break; sleep 1; done
  for mode in $3; do
    extra=""; [ $mode = words ] && extra="--stream-text words --piece-interval-ms 40"
    PYTHONPATH=.:services/tts/src timeout $4 python3 -m bench.openloop --addr 127.0.0.1:50051 --http-port 8001 \
      --rates 1,10,20 --duration 20 --warmup 3 --procs 4 --frames-per-message 4 $extra \
      --prompts bench/prompts/en_read_1088_first_word_one_token.txt --out $OUT/ol_$2_$mode.json > /dev/null 2> $OUT/ol_$2_$mode.log
    grep "openloop: rate" $OUT/ol_$2_$mode.log | sed "s/^/$2 $mode: /"
  done
  kill $srv; wait $srv
}
run old/services/tts/src old words 150
run services/tts/src new "words whole" 150
