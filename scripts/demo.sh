#!/usr/bin/env bash
# The README's first command: serves the demo models on 127.0.0.1:8080 in
# the foreground; Ctrl-C drains and exits. Each step is skipped when it is
# already done, so a second start takes a moment, not a build:
#   1. installs the Debian packages building needs, only those missing
#      (scripts/deps.sh --demo: build-essential meson ninja-build
#      pkg-config libjansson-dev libuv1-dev libhttp-parser-dev nettle-dev
#      zlib1g-dev;
#      apt-get, with sudo unless root). Nothing for the tests or PyTorch:
#      scripts/test.sh installs those.
#   2. configures build/ once (meson setup -Dtests=false -Dcuda=disabled:
#      no Criterion needed, no CUDA module) and brings the one thing the
#      demo runs, the canopy binary, up to date (ninja canopy: nothing to
#      do when no source changed; an existing build/ is reused as it is
#      configured). scripts/test.sh turns the tests on in the same build/.
#      On a fresh clone: 112 build steps and 29 s of user CPU (`meson setup B
#      -Dtests=false -Dcuda=disabled && ninja -C B canopy` under
#      /usr/bin/time) where building everything took 271 steps and 81 s
#      (`meson setup B && ninja -C B`, with the CUDA toolkit installed;
#      2 shared cores, so wall times varied with the load: 176 s and 429 s).
#   3. creates the demo models that are missing (scripts/models.sh) under
#      models/, which git ignores; FORCE=1 remakes them.
#   4. runs `canopy serve` on them.
# Environment:
#   CANOPY_PORT=P        port to serve on (default 8080)
#   CANOPY_MODELS_DIR=D  where the demo models are made and served from
#                        (default models/ in the checkout; relative to it)
#   CANOPY_BUILD_DIR=B   the build directory to use or make (default build)
# Extra arguments go to `canopy serve` (scripts/demo.sh --workers 4).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d;s/^# \{0,1\}//'; exit 0;; esac
port=${CANOPY_PORT:-8080}
build=${CANOPY_BUILD_DIR:-build}
models=${CANOPY_MODELS_DIR:-models}
say() { echo "demo: $*" >&2; }
scripts/deps.sh --demo
if [ -f "$build/build.ninja" ]; then
  say "reusing $build/"
else
  say "configuring $build/ (meson setup -Dtests=false -Dcuda=disabled, once)"
  meson setup "$build" -Dtests=false -Dcuda=disabled >/dev/null
fi
# only the binary the demo runs, not the tests, tools or CUDA module an
# existing build/ may be configured with (prints what it compiles)
ninja -C "$build" canopy >&2
count() { find "$models" -maxdepth 2 -name model.json 2>/dev/null | wc -l; }
before=$(count || true)
CANOPY_MODELS_DIR=$models scripts/models.sh "$build" >/dev/null
after=$(count)
if [ "$before" -eq "$after" ]; then
  say "reusing the $after models under $models/ (FORCE=1 scripts/models.sh remakes them)"
else
  say "made $((after - before)) demo models under $models/"
fi
cat >&2 <<MSG
canopy: serving $(ls "$models" | tr '\n' ' ')on http://127.0.0.1:$port (CANOPY_PORT)
  try:  curl -s -d '{"text": "The cat sat on the mat ."}' http://127.0.0.1:$port/v1/models/tagger/infer
        CANOPY_URL=http://127.0.0.1:$port clients/curl-examples.sh
        /usr/bin/python3 clients/loadgen.py --url http://127.0.0.1:$port --model treelstm --input scripts/demo-data/trees-binary.jsonl --concurrency 16 --duration 10
MSG
exec "$build/canopy" serve --models-dir "$models" --port "$port" "$@"
