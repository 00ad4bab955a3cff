#!/usr/bin/env bash
# Runs every package's tests in its own virtualenv, then the cross-service tests in
# tests/; reports every failure and exits non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
failed=()
# The TTS engine must be proved against the official code, never silently skipped.
export VOICE_REQUIRE_ORACLE=1
run() {  # run NAME PYTHON ARGS...
  local name=$1 py=$2; shift 2
  echo "=== pytest: $name"
  local t0=$SECONDS
  "$py" -m pytest -q -p no:cacheprovider --durations=10 "$@"  # the slowest: where time goes
  local rc=$?
  echo "=== $name: rc=$rc in $((SECONDS - t0)) s"
  [ $rc -eq 0 ] || failed+=("$name")
}
for svc in "$@"; do
  [ -d "services/$svc/tests" ] || { echo "=== $svc: no tests folder"; failed+=("$svc(no tests)"); continue; }
  run "$svc" ".venv/$svc/bin/python" "services/$svc/tests"
done
# The shared test helpers, in a venv that has them and gRPC.
run "voice-testkit" ".venv/tts/bin/python" libs/voice-testkit/tests
run "voice-keys" ".venv/tts/bin/python" libs/voice-keys/tests
# The benchmarks' own tests (bench/ is a package; they drive the TTS server: its venv).
run "bench" ".venv/tts/bin/python" bench/tests
run "tests" ".venv/tools/bin/python" tests
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
echo "all test suites passed"
