#!/usr/bin/env bash
# One device call: install carried wheels, GPU tests, then the engine bench (0.6B; 1.7B and
# decoder-precision variants on request), the peer, and the gRPC service, all on the same
# GPU in the same run. Results under $OUT (or bench/out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/services/tts/src:$PWD/libs/voice-keys/src:$PWD
# .whl-llm: transformers and its deps, for the thinker; .whl-agent, .whl-av, .whl-sphinx,
# .whl-moon: the agent's (livekit-agents, silero, ...; av; pocketsphinx; moonshine-voice, its
# default ear), for the loop. Over the 64 MiB a call
# carries, so they can come in two calls: what one call installs stays while the machine
# is held (30 s idle).
for wheels in .whl .whl-llm .whl-sphinx .whl-moon .whl-rvt; do
  if compgen -G "$wheels/*.whl" >/dev/null; then  # .whl-moon may hold model files only
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site $wheels/*.whl
  fi
done
for wheels in .whl-agent .whl-agent2 .whl-av; do  # av alone: with the rest it is over a call's 64 MiB
  [ -d $wheels ] || continue
  # pip --target keeps one wheel's part of a namespace package (livekit.rtc, .agents,
  # .plugins...): the last moved in replaces the rest. Unpacked instead (their *.data
  # copies are in the packages too).
  python3 -c 'import sys, zipfile
for w in sys.argv[1:]:
    z = zipfile.ZipFile(w)
    z.extractall("/tmp/site", [n for n in z.namelist() if ".data/" not in n.split("/")[0] + "/"])' $wheels/*.whl
done
if [ -d .whl-moon/moonshine_voice ]; then  # Moonshine's model files alone (device_wheels.sh)
  mkdir -p /tmp/site && cp -r .whl-moon/moonshine_voice /tmp/site/
fi
[ -d /tmp/site ] && export PYTHONPATH=$PYTHONPATH:/tmp/site
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
FRAMES=${FRAMES:-120}
if [ -n "${WITH_TESTS:-}" ]; then
  # test_kernels.py and test_gemv.py run their CPU-interpreter checks compiled here.
  timeout "${TEST_TIMEOUT:-420}" python3 -m pytest -q -p no:cacheprovider ${GPU_TESTS:-services/tts/tests/engine/test_kernels.py \
    services/tts/tests/engine/test_gemv.py services/tts/tests/engine/test_graphs_gpu.py} > "$OUT/gpu_tests.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log"
fi
for prec in $([ "${WITH_ENGINE:-1}" = 0 ] || echo "${PRECISIONS:-auto}"); do  # WITH_ENGINE=0: no engine bench
  python3 -m bench.run --preset 0.6b --frames "$FRAMES" --concurrency "${LEVELS:-1,4,16,32,64,128,256}" \
    --decoder-precision "$prec" --out "$OUT/engine_0.6b_$prec.json" 2>&1 | grep -v Warning | tee "$OUT/engine_0.6b_$prec.log" | grep -v '^{"conc'
done
if [ -n "${WITH_17B:-}" ]; then
  python3 -m bench.run --preset 1.7b --frames "$FRAMES" --concurrency 1,16,64 \
    --out "$OUT/engine_1.7b.json" 2>&1 | grep -v Warning | tee "$OUT/engine_1.7b.log" | grep -v '^{"conc'
fi
if [ "${WITH_PEER:-1}" != 0 ] && [ -f .peer/faster_qwen3_tts_bench.py ]; then
  timeout 300 python3 .peer/faster_qwen3_tts_bench.py "$FRAMES" 2>&1 | grep -v Warning | tee "$OUT/peer.log"
fi
if [ -n "${WITH_GRPC:-}" ]; then
  # No pacing: the client-side RTF then measures synthesis, not real-time delivery.
  TTS_MODEL=preset:0.6b TTS_DEVICE=cuda TTS_MAX_SESSIONS=64 TTS_HTTP_PORT=0 TTS_PACE_LEAD_S=0 \
    python3 -m voice_tts.server > "$OUT/server.log" 2>&1 &
  srv=$!
  for _ in $(seq 300); do grep -q "TTS serving" "$OUT/server.log" && break; sleep 1; done
  python3 -m bench.grpc_bench --concurrency 1,16 2>&1 | tee "$OUT/grpc.log"
  kill $srv; wait $srv
fi
if [ -n "${WITH_INTERFACES:-}" ]; then
  # gRPC, OpenAI HTTP and WebSocket TTFB against one server, the protocols alternated in
  # rounds (bench/interfaces_bench.py); unpaced, as for WITH_GRPC.
  TTS_MODEL=preset:0.6b TTS_DEVICE=cuda TTS_MAX_SESSIONS=64 TTS_HTTP_PORT=8001 TTS_PACE_LEAD_S=0 \
    python3 -m voice_tts.server > "$OUT/interfaces_server.log" 2>&1 &
  srv=$!
  for _ in $(seq 300); do grep -q "TTS serving" "$OUT/interfaces_server.log" && break; sleep 1; done
  python3 -m bench.interfaces_bench --grpc-addr 127.0.0.1:50051 --http http://127.0.0.1:8001 \
    --concurrency "${IF_LEVELS:-1,16}" --rounds "${IF_ROUNDS:-10}" --frames "${IF_FRAMES:-60}" \
    --out "$OUT/interfaces.json" 2>&1 | tee "$OUT/interfaces.log"
  kill $srv; wait $srv
fi
if [ -n "${WITH_SOAK:-}" ]; then
  # Open-loop soak through the real server (bench/soak/), per preset: Poisson arrivals at
  # SOAK_RATE/s for SOAK_DURATION s, EOS active, STOP/RESET/cancel mixed in; JSON summary,
  # server log and progress under $OUT. The presets share SOAK_DEADLINE s (the whole call
  # has 600): a soak whose server starts slowly gets shorter arrivals, not killed.
  presets=${SOAK_PRESETS:-0.6b}; n=$(echo $presets | wc -w)
  for p in $presets; do
    timeout -k 15 $(( ${SOAK_DEADLINE:-540} / n + 30 )) python3 -m bench.soak --start-server \
      --model "preset:$p" --device cuda --max-sessions "${SOAK_MAX_SESSIONS:-256}" \
      --rate "${SOAK_RATE:-50}" --duration "${SOAK_DURATION:-120}" --procs "${SOAK_PROCS:-4}" \
      --deadline $(( ${SOAK_DEADLINE:-540} / n )) --out "$OUT/soak_$p.json" \
      --server-log "$OUT/soak_server_$p.log" ${SOAK_ARGS:-} 2>&1 >/dev/null | tee "$OUT/soak_$p.log"
    # at most 16 MiB per file comes back from the device
    if [ "$(stat -c %s "$OUT/soak_server_$p.log" 2>/dev/null || echo 0)" -gt 8000000 ]; then
      gzip -f "$OUT/soak_server_$p.log"
    fi
  done
fi
if [ -n "${WITH_OPENLOOP:-}" ]; then
  # The field's method (bench/openloop.py): Poisson arrivals at each of OL_RATES, OL_WARMUP
  # s of warm-up then OL_DURATION s counted per rate, the shipped prompt set, client TTFA
  # and underruns; one server per preset. OL_ARGS=--stream-text for the LLM-speed mode.
  # OL_CLONE=N: a Base preset (OL_PRESETS=1.7b-base) gets N cloned voices, made before the
  # sweep (timed; first vs cached use at idle) from OL_CLONE_SECONDS s synthetic references
  # (OL_CLONE_MODE icl | xvec), every call speaking with one of them; compare with the
  # CustomVoice preset's run (OL_PRESETS=1.7b) on the same machine.
  for p in ${OL_PRESETS:-0.6b}; do
    clone=()
    case $p in *-base)
      [ -n "${OL_CLONE:-}" ] && clone=(--clone-voices "$OL_CLONE" --clone-audio synth \
        --clone-seconds "${OL_CLONE_SECONDS:-10}" --clone-mode "${OL_CLONE_MODE:-icl}") ;;
    esac
    timeout -k 15 "${OL_TIMEOUT:-560}" python3 -m bench.openloop --start-server \
      --model "preset:$p" --device cuda --max-sessions "${OL_MAX_SESSIONS:-256}" \
      --rates "${OL_RATES:-1,10,20}" --duration "${OL_DURATION:-120}" --warmup "${OL_WARMUP:-10}" \
      --procs "${OL_PROCS:-4}" --out "$OUT/openloop_$p${OL_TAG:-}.json" "${clone[@]}" \
      --server-log "$OUT/openloop_server_$p${OL_TAG:-}.log" ${OL_ARGS:-} 2>&1 >/dev/null \
      | tee "$OUT/openloop_$p${OL_TAG:-}.log"
    gzip -f "$OUT/openloop_server_$p${OL_TAG:-}.log"
  done
fi
if [ -n "${WITH_ONE_GPU:-}" ]; then
  # The thinker (Transformers backend, a real shape with random weights) and the TTS on this
  # GPU: time-slicing, MPS, MPS with priorities; each load alone and both together
  # (bench/one_gpu.py). Needs .whl-llm (transformers and its deps) on a host without them.
  # OG_LOOP=1,16 adds the whole loop (bench/agent_loop.py; needs .whl-agent, .whl-sphinx
  # and the speech in OG_LOOP_WAVS, made here: python -m bench.agent_loop make-wavs DIR).
  # OG_CONV=1,16,64 adds conversations per GPU (bench/conversations.py through OG_AGENTS
  # serve-direct agents, OG_AGENT_ENV their settings, OG_CONV_ARGS the generator's).
  # OG_RVT=10 adds end of turn -> first audio over /v1/talk vs /v1/realtime (one agent,
  # bench/realtime_vs_talk.py; OG_RVT_ARGS its arguments; .whl-rvt: websockets for openai).
  PYTHONPATH=$PYTHONPATH:services/llm/src:services/agent/src timeout -k 15 "${OG_TIMEOUT:-560}" \
    python3 -m bench.one_gpu --modes "${OG_MODES:-timeslice,mps-nocap,mps-prio}" \
    --tts-model "preset:${OG_TTS:-0.6b}" --llm-model "${OG_LLM:-random:qwen3-1.7b}" \
    --tts-sessions "${OG_TTS_SESSIONS:-256}" --rate "${OG_RATE:-10}" --seconds "${OG_SECONDS:-30}" --chats "${OG_CHATS:-4}" \
    --phases "${OG_PHASES:-}" --loop "${OG_LOOP:-}" --loop-wavs "${OG_LOOP_WAVS:-.loopwavs}" \
    --conv "${OG_CONV:-}" --agents "${OG_AGENTS:-8}" --conv-args "${OG_CONV_ARGS:-}" \
    --rvt "${OG_RVT:-0}" --rvt-args "${OG_RVT_ARGS:-}" \
    $(for kv in ${OG_AGENT_ENV:-}; do echo --agent-env "$kv"; done) \
    $(for kv in ${OG_SHARES:-}; do echo --share "$kv"; done) \
    $(for kv in ${OG_LLM_ENV:-}; do echo --llm-env "$kv"; done) \
    --out "$OUT/one_gpu${OG_TAG:-}" 2>&1 | tail -40
  # One archive: the device returns a limited number of files.
  tar czf "$OUT/one_gpu${OG_TAG:-}.tgz" -C "$OUT" "one_gpu${OG_TAG:-}" && rm -rf "$OUT/one_gpu${OG_TAG:-}"
fi
