# The shared part of this directory's scripts: wheels, `serve PRESET TAG`, `ol TAG RATES DUR [openloop args]`.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/services/tts/src:$PWD/libs/voice-keys/src:$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
serve() {  # $1 preset $2 tag
  TTS_MODEL=preset:$1 TTS_DEVICE=cuda TTS_MAX_SESSIONS=512 TTS_MAX_SEQ_LEN=1024 TTS_GRPC_PORT=50051 TTS_HTTP_PORT=8001 \
    python3 -m voice_tts.server > $OUT/server_$2.log 2>&1 &
  srv=$!
  for _ in $(seq 300); do grep -q "TTS serving" $OUT/server_$2.log && break; kill -0 $srv 2>/dev/null || { tail -3 $OUT/server_$2.log; exit 1; }; sleep 1; done
  echo "$2 serving t=$(( $(date +%s) - t0 ))s"
}
ol() {  # $1 tag $2 rates $3 dur, rest: openloop args
  local tag=$1 rates=$2 dur=$3; shift 3
  timeout $(( $dur * 4 + 90 )) python3 -m bench.openloop --addr 127.0.0.1:50051 --http-port 8001 --rates $rates \
    --duration $dur --warmup 5 --procs 4 --frames-per-message 4 "$@" \
    --out $OUT/ol_$tag.json > /dev/null 2> $OUT/ol_$tag.log
  python3 - $OUT/ol_$tag.json $tag <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    p = r["server_parts_ms"]
    f = lambda d: f"{d['p50']}/{d['p95']}"
    print(sys.argv[2], r["rate"], "client", f(r["ttfa_ms"]), "server", f(r["server_ttfa_ms"]),
          "queue", f(p["queue"]), "prefill", f(p["prefill"]), "first_packet", f(p["first_packet"]),
          "started", f(r["session_started_ms"]), "rej", r["rejected"],
          "step", r["server_step_ms_mean"], "batch", r["server_batch_mean"],
          "late>20ms", r["underruns"]["over_20ms"], "calls", r["calls"])
PY
  echo "t=$(( $(date +%s) - t0 ))s"
}
