#!/usr/bin/env bash
# Issue 35, streaming text at 20 req/s (not reached on 2026-11-25): a word every 40 ms
# against the whole sentence + FLUSH, same server, same prompts (they open with a one-token
# word), 1 / 10 / 20 req/s; then the GPU tests the talker-skip refactor touches.
# Usage: MODEL=0.6b DUR=30 GPU_TESTS=1 bash bench/results/2026-11-26-words/run.sh
set -uo pipefail
. "$(dirname "$0")/../2026-11-26-low-rate/lib.sh"
m=${MODEL:-0.6b}
P=bench/prompts/en_read_1088_first_word_one_token.txt
serve $m $m
ol words_$m ${RATES:-1,10,20} ${DUR:-30} --prompts $P --stream-text words --piece-interval-ms 40
ol whole_$m ${RATES:-1,10,20} ${DUR:-30} --prompts $P
kill $srv; wait $srv
gzip -f $OUT/server_*.log
if [ "${GPU_TESTS:-0}" = 1 ]; then
  timeout 240 python3 -m pytest -q -p no:cacheprovider services/tts/tests/engine/test_graphs_gpu.py \
    -k "graphs_equal_eager or batched_equals_solo or slot_reused" > $OUT/gpu_tests.log 2>&1
  tail -3 $OUT/gpu_tests.log
fi
echo "t=$(( $(date +%s) - t0 ))s"
