#!/usr/bin/env bash
# Issue 35: open streams past 256 (TTS_MAX_SESSIONS=512, TTS_MAX_BATCH 256), 4 frames a message.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=services/tts/src:.:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
serve() {  # $1 preset $2 sessions
  TTS_MODEL=preset:$1 TTS_DEVICE=cuda TTS_MAX_SESSIONS=$2 TTS_MAX_SEQ_LEN=${SEQ:-1024} TTS_GRPC_PORT=50051 TTS_HTTP_PORT=8001 \
    python3 -m voice_tts.server > $OUT/server_$1.log 2>&1 &
  srv=$!
  for _ in $(seq 300); do grep -q "TTS serving" $OUT/server_$1.log && break; kill -0 $srv 2>/dev/null || { tail -3 $OUT/server_$1.log; exit 1; }; sleep 1; done
  grep -E "TTS serving|captured|graphs" $OUT/server_$1.log | cut -c1-220
  nvidia-smi --query-gpu=memory.used --format=csv,noheader
}
ol() {  # $1 tag $2 rate $3 dur
  timeout $(( $3 + 60 )) python3 -m bench.openloop --addr 127.0.0.1:50051 --http-port 8001 --rates $2 \
    --duration $3 --warmup 5 --procs 4 --frames-per-message 4 \
    --out $OUT/ol_$1_$2.json > /dev/null 2> $OUT/ol_$1_$2.log
  grep "openloop: rate" $OUT/ol_$1_$2.log | sed "s/^/$1: /"
  python3 -c "import json,sys;r=json.load(open('$OUT/ol_$1_$2.json'))['rows'][0];print(r['rejected'],r['admission_rejected_total'],r['server_step_ms_mean'],r['server_batch_mean']);print('\n'.join(r['rejection_examples']))" 2>&1 | cut -c1-300
  curl -s localhost:8001/metrics | grep -E "^tts_(admission_rejected_total|sessions|speaking)" | tr '\n' ' '; echo
  echo "t=$(( $(date +%s) - t0 ))s"
}
serve 0.6b 512
for r in ${RATES:-60 70}; do ol 0.6b $r ${DUR:-60}; done
kill $srv; wait $srv; gzip -f $OUT/server_0.6b.log
if [ -n "${CLOSED:-1}" ]; then
  for mp in 64 256; do
    timeout 150 python3 -m bench.run --preset 0.6b --frames 120 --concurrency 256 --max-prefills $mp \
      --out $OUT/engine_0.6b_mp$mp.json 2>&1 | grep -v Warning | tee $OUT/engine_0.6b_mp$mp.log | grep -v '^{"conc' | tail -2 | sed "s/^/mp $mp: /"
  done
  echo "t=$(( $(date +%s) - t0 ))s"
fi
if [ -n "${R17:-50}" ] && [ $(( $(date +%s) - t0 )) -lt ${T17:-400} ]; then
  serve 1.7b 512
  for r in ${R17:-50}; do ol 1.7b $r ${DUR17:-60}; done
  kill $srv; wait $srv; gzip -f $OUT/server_1.7b.log
fi
