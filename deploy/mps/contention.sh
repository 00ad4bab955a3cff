#!/usr/bin/env bash
# Why compose gives each GPU service an MPS priority: a TTS-like step next to a
# prefill-like load, without MPS (time-slicing), with MPS and no caps, with SM caps (tts
# 50 %, llm 70 %: the former compose defaults), and with client priorities (the big load
# below normal, the compose gpu profile). Also checks, as uid 10001 against a root daemon with a 1777
# pipe directory (the compose layout), the memory cap and the SM count under a cap.
# Needs: an NVIDIA GPU, nvidia-cuda-mps-control, python3 with CUDA torch, root (setpriv).
# Usage: deploy/mps/contention.sh [RESULTS_DIR]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$(mktemp -d)}
mkdir -p "$out"
py=$(command -v python3)
export HOME=/tmp
pair() {  # pair NAME [ENV for big] -- [ENV for small]: big in the background, small timed
  local name=$1; shift
  local big_env=() small_env=()
  while [ "$1" != -- ]; do big_env+=("$1"); shift; done; shift
  small_env=("$@")
  env "${big_env[@]}" "${RUN[@]}" "$py" "$here/contention.py" big 16 >"$out/${name}_big.json" &
  local pid=$!
  sleep 4
  env "${small_env[@]}" "${RUN[@]}" "$py" "$here/contention.py" small 8 >"$out/${name}_small.json"
  wait "$pid"
}

nvidia-smi --query-gpu=name,memory.total,compute_mode --format=csv,noheader
RUN=()
"$py" "$here/contention.py" small 8 >"$out/solo_small.json"
pair timeslice --
export CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps CUDA_MPS_LOG_DIRECTORY=/tmp/nvidia-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
chmod 1777 "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d
sleep 1
echo get_server_list | nvidia-cuda-mps-control >/dev/null && echo "mps healthcheck: ok"
# setpriv takes the numeric uid/gid of the images' user: no passwd entry needed.
RUN=(setpriv --reuid=10001 --regid=10001 --clear-groups)
env CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10G \
  "${RUN[@]}" "$py" "$here/contention.py" limits >"$out/mps_limits.json"
pair mps_nocap --
pair mps_caps CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=70 -- CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50
# Client priorities, no caps (the compose gpu profile): the big load below normal.
pair mps_prio CUDA_MPS_CLIENT_PRIORITY=1 -- CUDA_MPS_CLIENT_PRIORITY=0
echo quit | nvidia-cuda-mps-control
for f in "$out"/*.json; do echo "$(basename "$f" .json): $(cat "$f")"; done
