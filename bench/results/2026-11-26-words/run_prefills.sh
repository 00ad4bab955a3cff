#!/usr/bin/env bash
# TTS_MAX_PREFILLS default (64 or 256): the 1.7B server at 512 slots x 1024 KV rows (the
# largest setting we run) with each: start-up time, GPU memory, 50 req/s for DUR s; then
# the closed loop c = 256 on the 0.6B engine with each (bench.run, 120 frames a stream).
# Usage: DUR=30 bash bench/results/2026-11-26-words/run_prefills.sh
set -uo pipefail
. "$(dirname "$0")/../2026-11-26-low-rate/lib.sh"
for mp in 256 64; do
  TTS_MAX_PREFILLS=$mp serve 1.7b mp${mp}_1.7b
  grep -E "graphs|captured|serving" $OUT/server_mp${mp}_1.7b.log | tail -4 | cut -c1-300
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader | sed "s/^/mp $mp memory: /"
  ol mp${mp}_1.7b 50 ${DUR:-30} --prompts bench/prompts/en_read_1088.txt
  nvidia-smi --query-gpu=memory.used --format=csv,noheader | sed "s/^/mp $mp memory after: /"
  kill $srv; wait $srv
done
gzip -f $OUT/server_*.log
for mp in 256 64; do
  timeout 150 python3 -m bench.run --preset 0.6b --frames 120 --concurrency 256 --max-prefills $mp \
    --out $OUT/engine_0.6b_mp$mp.json 2>&1 | grep -v Warning > $OUT/engine_0.6b_mp$mp.log
  grep -v '^{"conc' $OUT/engine_0.6b_mp$mp.log | tail -2 | sed "s/^/c=256 mp $mp: /"
done
echo "t=$(( $(date +%s) - t0 ))s"
