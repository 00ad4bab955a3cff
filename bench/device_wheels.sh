#!/usr/bin/env bash
# The wheels a GPU host (the `device` tool's image: torch, numpy, grpcio, aiohttp,
# onnxruntime, transformers ... but none of our agent's stack) lacks to run the servers,
# the agent and the benches, downloaded here for CPython 3.12 x86-64, in folders under
# 64 MiB (what one device call carries): bench/gpu.sh installs whatever of them it finds.
#   bash bench/device_wheels.sh   # -> .whl (ours + small), .whl-agent(2), .whl-av, .whl-moon (a tree)
# Needs the services' venvs (make venvs): their pins are what is downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
# On the image already, at versions that serve (KINDS.md's package list); torch's stack
# and the heavy ones must never travel.
HAVE='^(torch|uvloop|playwright|greenlet|pyee|triton|numpy|nvidia-.*|onnxruntime|transformers|tokenizers|safetensors|huggingface-hub|hf-xet|aiohttp|aiosignal|aiohappyeyeballs|frozenlist|multidict|yarl|propcache|attrs|psutil|pyyaml|regex|requests|urllib3|idna|certifi|charset-normalizer|filelock|fsspec|jinja2|markupsafe|sympy|mpmath|networkx|packaging|typing-extensions|setuptools|tqdm|pillow|scipy|click|pygments|rich|markdown-it-py|mdurl|sentencepiece|anyio|h11|httpx|httpcore|colorama|six|python-dateutil|cuda-.*|pytest.*|pluggy|iniconfig|coverage|execnet|hypothesis|sortedcontainers|voice-.*)$'
pins() {  # the pinned requirements of the given venvs, less what the image has
  for v in "$@"; do .venv/$v/bin/pip freeze --exclude-editable 2>/dev/null || true; done \
    | grep '==' | sort -u | awk -F'==' -v have="$HAVE" '{n = tolower($1); gsub(/[_.]/, "-", n)} n !~ have'
}
get() {  # get DIR REQ...
  local dir=$1; shift
  mkdir -p "$dir"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp $(for n in $(seq 17 39); do echo --platform manylinux_2_${n}_x86_64; done) \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
    -d "$dir" "$@"
}
mapfile -t all < <(pins tts llm agent)
small=() agent=() agent2=() av=() moon=()
for req in "${all[@]}"; do
  case "${req,,}" in
    av==*) av+=("$req") ;;
    moonshine-voice==*) moon+=("$req") ;;
    pocketsphinx==*|ruff==*) ;;  # pocketsphinx: an sdist for 3.12 (the ear is Moonshine)
    livekit-local-inference==*) agent2+=("$req") ;;  # 33 MB: its own call
    livekit*) agent+=("$req") ;;
    *) small+=("$req") ;;
  esac
done
get .whl "${small[@]}"
.venv/tools/bin/pip wheel -q --no-deps -w .whl ./proto   # our stubs, built here
get .whl-agent "${agent[@]}"
get .whl-agent2 "${agent2[@]}"
get .whl-av "${av[@]}"
# Moonshine: only tiny-en's model files (43 MB; the wheel is 117 MB with its C library,
# which our ear never loads: voice_agent/moonshine.py)
get /tmp/moon-wheel "${moon[@]}"
rm -rf .whl-moon && mkdir -p .whl-moon/moonshine_voice
python3 -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
z.extractall(".whl-moon", [n for n in z.namelist() if "/assets/tiny-en/" in n])' /tmp/moon-wheel/moonshine_voice-*.whl
touch .whl-moon/moonshine_voice/__init__.py
du -sh .whl .whl-agent .whl-agent2 .whl-av .whl-moon
