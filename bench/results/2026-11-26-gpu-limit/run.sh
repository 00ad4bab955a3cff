#!/usr/bin/env bash
# Issue 35 (H100, 2026-11-26): 120 s rows at the highest rates (0.6B 60 req/s, 1.7B 50 req/s,
# shipped prompts) and the low rates 1 / 10 / 20 req/s (45 s each, en_read_1088: median 80
# characters), 512 slots, 1024 KV rows, 4 frames a message, EOS on. Needs .whl carried.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/services/tts/src:$PWD/libs/voice-keys/src:$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
serve() {  # $1 preset
  TTS_MODEL=preset:$1 TTS_DEVICE=cuda TTS_MAX_SESSIONS=512 TTS_MAX_SEQ_LEN=1024 TTS_GRPC_PORT=50051 TTS_HTTP_PORT=8001 \
    python3 -m voice_tts.server > $OUT/server_$1.log 2>&1 &
  srv=$!
  for _ in $(seq 300); do grep -q "TTS serving" $OUT/server_$1.log && break; kill -0 $srv 2>/dev/null || { tail -3 $OUT/server_$1.log; exit 1; }; sleep 1; done
  echo "$1 serving t=$(( $(date +%s) - t0 ))s"
}
ol() {  # $1 tag $2 rates $3 dur, rest: openloop args
  local tag=$1 rates=$2 dur=$3; shift 3
  timeout $(( $dur * 4 + 90 )) python3 -m bench.openloop --addr 127.0.0.1:50051 --http-port 8001 --rates $rates \
    --duration $dur --warmup 5 --procs 4 --frames-per-message 4 "$@" \
    --out $OUT/ol_$tag.json > /dev/null 2> $OUT/ol_$tag.log
  grep "openloop: rate" $OUT/ol_$tag.log | sed "s/^/$tag: /"
  python3 -c "import json;[print(r['rate'],'client',r['ttfa_ms'],'server',r['server_ttfa_ms'],'rej',r['rejected'],'step',r['server_step_ms_mean'],'batch',r['server_batch_mean']) for r in json.load(open('$OUT/ol_$tag.json'))['rows']]" 2>&1 | cut -c1-400
  echo "t=$(( $(date +%s) - t0 ))s"
}
serve 0.6b
ol 0.6b_low 1,10,20 45 --prompts bench/prompts/en_read_1088.txt
ol 0.6b_60 60 120
kill $srv; wait $srv; gzip -f $OUT/server_0.6b.log
if [ $(( $(date +%s) - t0 )) -lt 330 ]; then
  serve 1.7b
  ol 1.7b_50 50 120
  kill $srv; wait $srv; gzip -f $OUT/server_1.7b.log
fi
