#!/usr/bin/env bash
# Proto lint and wire-compatibility check with the real `buf` CLI (from npm, cached in
# .tools/). `lint`: style rules of proto/buf.yaml, then `buf breaking` against the image
# of the released v1 contract (tests/proto/released_v1.json): a renumbered, retyped or
# removed field fails. `snapshot`: rewrite that image (only for a new, additive release).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUF=.tools/node_modules/.bin/buf
if [ ! -x "$BUF" ]; then
  npm install --prefix .tools --no-audit --no-fund --silent @bufbuild/buf@1.75.0
fi
case "${1:-lint}" in
  lint)
    "$BUF" lint proto
    "$BUF" breaking proto --against tests/proto/released_v1.json
    echo "proto: buf lint + breaking OK"
    ;;
  snapshot)
    "$BUF" build proto -o tests/proto/released_v1.json
    ;;
  *) echo "usage: $0 [lint|snapshot]" >&2; exit 2 ;;
esac
