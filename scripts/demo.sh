#!/usr/bin/env bash
# The main job (README): installs the Debian packages, builds, creates one
# demo model per family under models/, and runs the daemon on them in the
# foreground (127.0.0.1:8080 unless CANOPY_PORT / --port say otherwise).
# Extra arguments go to `canopy serve`. Ctrl-C drains and exits.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
[ -f build/build.ninja ] || meson setup build >/dev/null
ninja -C build >/dev/null
scripts/models.sh build
port=${CANOPY_PORT:-8080}
cat >&2 <<MSG
canopy: serving $(ls models | tr '\n' ' ')on http://127.0.0.1:$port
  try:  curl -s -d '{"text": "The cat sat on the mat ."}' http://127.0.0.1:$port/v1/models/tagger/infer
        CANOPY_URL=http://127.0.0.1:$port clients/curl-examples.sh
        /usr/bin/python3 clients/loadgen.py --url http://127.0.0.1:$port --model treelstm --input scripts/demo-data/trees-binary.jsonl --concurrency 16 --duration 10
MSG
exec build/canopy serve --models-dir models --port "$port" "$@"
