#!/usr/bin/env bash
# Issue 49, round 3 (the next device session): round 2's run.sh (../2026-11-27-gpu-bound) with
# - each row starting only once the server has no stream open (a row right after an
#   overloaded one inherited its drain: round 2's 20 req/s row after 60 req/s);
# - after each server, the soak's checks: open streams back to 0, error counters and
#   error-log lines, GPU memory at the end (metrics_*.txt; the progress lines show it during).
# One device call per preset (needs .whl carried), e.g. the admission budget sweep:
#   P=0.6b VARIANTS="b20: b30:TTS_ADMIT_FRAME_BUDGET_MS=30 b40:TTS_ADMIT_FRAME_BUDGET_MS=40" \
#     ROWS="r60:60:120:--frames-per-message=1" bash bench/results/2026-11-28-gpu-bound/run.sh
# streaming text against whole sentences, then the 300 s soak at the highest rate:
#   P=0.6b ROWS="whole:1,10,20:25:--frames-per-message=1 words:1,10,20:25:--stream-text=words \
#     soak:60:300:--frames-per-message=1" bash .../run.sh
set -uo pipefail
[ -n "${NOWHL:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/services/tts/src:$PWD/libs/voice-keys/src:$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
P=${P:-0.6b}; t0=$(date +%s)
el() { echo "t=$(( $(date +%s) - t0 ))s $*"; }
if [ -n "${BOUND:-}" ]; then
  python3 -m bench.run --preset $P --frames 120 --concurrency "$BOUND" --out $OUT/bound_$P.json \
    2>&1 | grep -v Warning > $OUT/bound_$P.log
  python3 - $OUT/bound_$P.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("build_s", d["build_s"])
for r in d["results"]:
    print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()})
PY
  el bound
fi
serve() {  # $1 tag, rest: env for the server
  local tag=$1; shift
  env "$@" TTS_MODEL=preset:$P TTS_DEVICE=${DEVICE:-cuda} TTS_MAX_SESSIONS=512 TTS_MAX_SEQ_LEN=1024 TTS_GRPC_PORT=50051 \
    TTS_HTTP_PORT=8001 python3 -m voice_tts.server > $OUT/server_${P}_$tag.log 2>&1 &
  srv=$!
  for _ in $(seq 300); do grep -q "TTS serving" $OUT/server_${P}_$tag.log && break; kill -0 $srv 2>/dev/null || { tail -5 $OUT/server_${P}_$tag.log; exit 1; }; sleep 1; done
  el "serving $tag $*"
}
metric() {  # summed over its labels
  curl -s localhost:8001/metrics | awk -v m="$1" 'index($1, m) == 1 && substr($1, length(m) + 1, 1) ~ /^(\{|)$/ {s += $2} END {print s + 0}'
}
idle() {  # until no stream is open (paced audio plays out), 60 s at most
  for _ in $(seq 120); do [ "$(metric tts_active_sessions)" = "0" ] && return; sleep 0.5; done
  echo "still open: $(metric tts_active_sessions)"
}
stop() {
  idle
  { curl -s localhost:8001/metrics | grep -E "^tts_(admission_rejected|active_sessions|errors|gpu_memory|utterances)"
    echo "error log lines: $(grep -cE " (ERROR|CRITICAL) " $OUT/server_${P}_$1.log)"; } > $OUT/metrics_${P}_$1.txt
  grep -E "active_sessions|gpu_memory_bytes\{kind=.allocated|error log" $OUT/metrics_${P}_$1.txt
  kill $srv; wait $srv; gzip -f $OUT/server_${P}_$1.log
}
ol() {  # $1 tag $2 rates $3 dur, rest: openloop args
  local tag=$1 rates=$2 dur=$3; shift 3
  idle
  timeout $(( ${dur%.*} * 4 + 90 )) python3 -m bench.openloop --addr 127.0.0.1:50051 --http-port 8001 --rates $rates \
    --duration $dur --warmup 5 --procs 4 "$@" --out $OUT/ol_${P}_$tag.json > /dev/null 2> $OUT/ol_${P}_$tag.log
  python3 - $OUT/ol_${P}_$tag.json $tag <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    p = r["server_parts_ms"]; u = r["underruns"]
    f = lambda d: f"{d['p50']}/{d['p95']}/{d.get('p99')}"
    print(sys.argv[2], r["rate"], r["protocol"], "client", f(r["ttfa_ms"]), "server", f(r["server_ttfa_ms"]),
          "started", f(r["session_started_ms"]), "queue", f(p["queue"]), "prefill", f(p["prefill"]),
          "first_packet", f(p["first_packet"]), "rej", r["rejected"], "/", r["calls"],
          "adm", r["admission_rejected_total"], "peak", r["peak_inflight"],
          "late>20", u["over_20ms"], "late", u["late_frames"], "max", u["max_late_ms"],
          "step", r["server_step_ms_mean"], "batch", r["server_batch_mean"], "cpu", r["client_cpu_share"],
          "audio", r["audio_s_per_wall_s"], "errors", r["errors"])
PY
  el "$tag"
}
# ROWS: "tag:rates:seconds:openloop args" ...; VARIANTS: "tag:ENV=V,ENV=V" ... (one server each)
for v in ${VARIANTS:-default:}; do
  vt=${v%%:*}; venv=${v#*:}
  serve $vt $(echo "$venv" | tr , ' ')
  for r in ${ROWS:-low:1,10,20:25:--frames-per-message=1 fpm1:60:120:--frames-per-message=1 fpm4:60:120:--frames-per-message=4}; do
    IFS=: read -r tag rates dur args <<< "$r"
    ol ${vt}_$tag $rates $dur $(echo "$args" | tr , ' ')
  done
  stop $vt
done
el done
