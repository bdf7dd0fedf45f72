#!/usr/bin/env bash
# reliability.sh - the hardening checks against a real daemon, one table
# (docs/daemon.md "Reliability"): overload at twice capacity, SIGTERM under
# keep-alive load (also with pipelining clients), 2,000 slow connections, a
# soak, weights changed under a serving daemon. Each check starts its own
# daemon on a free port.
# usage: scripts/bench/reliability.sh [CHECK...]   (default: all; checks are
#        overload sigterm sigterm-pipelined slow soak weights)
#   SOAK_S=600 (the soak's length), SLOW=2000, MODELS=/tmp/canopy-reliability,
#   BUILD=build (the build dir: its canopy, and tools/canopy-load for the
#   overload check's open loop; CLIENT=python forces the Python client;
#   PEAK=c measures its peak with canopy-load --closed too; PEAK_AFTER=1
#   measures the peak again after the open loop)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
[ -f "$BUILD/build.ninja" ] || meson setup "$BUILD" >/dev/null
ninja -C "$BUILD" >/dev/null
data=${CANOPY_DATA:-data}/trees-binary.jsonl
[ -f "$data" ] || data=scripts/demo-data/trees-binary.jsonl
MODELS=${MODELS:-/tmp/canopy-reliability}
init="--hidden 256 --embed 128 --classes 5 --vocab-from $data"
[ -f "$MODELS/treelstm/model.json" ] ||
  "$BUILD/canopy" model init treelstm "$MODELS/treelstm" $init >/dev/null
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
exec /usr/bin/python3 scripts/bench/reliability.py --canopy "$BUILD/canopy" \
  --client "${CLIENT:-auto}" --peak-client "${PEAK:-python}" \
  ${PEAK_AFTER:+--peak-after} \
  --models "$MODELS" --model treelstm --family treelstm --init-args "$init" \
  --input "$data" --slow "${SLOW:-2000}" --soak-s "${SOAK_S:-600}" "$@"
