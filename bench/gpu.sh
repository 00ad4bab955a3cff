#!/usr/bin/env bash
# One device call: install carried wheels, GPU tests, then the engine bench (0.6B; 1.7B and
# decoder-precision variants on request), the peer, and the gRPC service, all on the same
# GPU in the same run. Results under $OUT (or bench/out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=services/tts/src:.
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
FRAMES=${FRAMES:-120}
if [ -n "${WITH_TESTS:-}" ]; then
  # test_kernels.py and test_gemv.py run their CPU-interpreter checks compiled here.
  timeout "${TEST_TIMEOUT:-420}" python3 -m pytest -q -p no:cacheprovider ${GPU_TESTS:-services/tts/tests/engine/test_kernels.py \
    services/tts/tests/engine/test_gemv.py services/tts/tests/engine/test_graphs_gpu.py} > "$OUT/gpu_tests.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log"
fi
for prec in ${PRECISIONS:-auto}; do
  python3 -m bench.run --preset 0.6b --frames "$FRAMES" --concurrency "${LEVELS:-1,4,16,32,64,128,256}" \
    --decoder-precision "$prec" --out "$OUT/engine_0.6b_$prec.json" 2>&1 | grep -v Warning | tee "$OUT/engine_0.6b_$prec.log" | grep -v '^{"conc'
done
if [ -n "${WITH_17B:-}" ]; then
  python3 -m bench.run --preset 1.7b --frames "$FRAMES" --concurrency 1,16,64 \
    --out "$OUT/engine_1.7b.json" 2>&1 | grep -v Warning | tee "$OUT/engine_1.7b.log" | grep -v '^{"conc'
fi
if [ -n "${WITH_PEER:-1}" ] && [ -f .peer/faster_qwen3_tts_bench.py ]; then
  timeout 300 python3 .peer/faster_qwen3_tts_bench.py "$FRAMES" 2>&1 | grep -v Warning | tee "$OUT/peer.log"
fi
if [ -n "${WITH_GRPC:-}" ]; then
  TTS_MODEL=preset:0.6b TTS_DEVICE=cuda TTS_MAX_SESSIONS=64 TTS_HTTP_PORT=0 \
    python3 -m voice_tts.server > "$OUT/server.log" 2>&1 &
  srv=$!
  for _ in $(seq 300); do grep -q "TTS serving" "$OUT/server.log" && break; sleep 1; done
  python3 -m bench.grpc_bench --concurrency 1,16 2>&1 | tee "$OUT/grpc.log"
  kill $srv; wait $srv
fi
