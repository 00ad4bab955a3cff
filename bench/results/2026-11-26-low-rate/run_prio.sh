#!/usr/bin/env bash
# The speech decoder's stream at the engine's priority (this tree) against its default
# priority (patched back here), 0.6B, same machine: the low rates and a 60 req/s row.
# A frame's decoder runs beside the next step's talker and code predictor; at default
# priority it waits behind them (c = 1: 3.2 ms beside them, ~1.7 alone), and a first
# frame's decoder is on TTFA's path.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
for v in high default; do
  if [ $v = default ]; then
    sed -i 's/self.stream = torch.cuda.Stream(priority=-1)/self.stream = torch.cuda.Stream()/' services/tts/src/voice_tts/engine/graphs.py
  fi
  grep -n "self.stream = torch.cuda.Stream" services/tts/src/voice_tts/engine/graphs.py
  serve 0.6b prio_$v
  ol prio_${v}_low 1,10,20 ${DUR:-25} --prompts bench/prompts/en_read_1088.txt
  ol prio_${v}_60 60 ${DUR_HIGH:-45}
  kill $srv; wait $srv
done
gzip -f $OUT/server_*.log
