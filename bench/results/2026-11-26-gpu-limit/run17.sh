#!/usr/bin/env bash
# Issue 35 (H100, 2026-11-26), second call: the 1.7B (low rates 30 s each on en_read_1088,
# 50 req/s for 120 s on the shipped prompts), then the peer (faster-qwen3-tts) on the same GPU.
set -uo pipefail
source <(sed -n '/^python3 -m pip/,/^}$/p;/^ol()/,/^}$/p' bench/results/2026-11-26-gpu-limit/run.sh)
export PYTHONPATH=$PWD/services/tts/src:$PWD/libs/voice-keys/src:$PWD:/tmp/site PYTHONUNBUFFERED=1
t0=$(date +%s)
serve 1.7b
ol 1.7b_low 1,10,20 30 --prompts bench/prompts/en_read_1088.txt
ol 1.7b_50 50 120
kill $srv; wait $srv; gzip -f $OUT/server_1.7b.log
timeout 200 python3 .peer/faster_qwen3_tts_bench.py 120 2>&1 | grep -v Warning | tee $OUT/peer.log | tail -20
