#!/bin/bash
# entrypoint.sh - the image's entrypoint: `canopy serve` on the models
# mounted at /models, or on the demo models built into the image when
# nothing is mounted there (a missing or empty directory). Arguments are
# passed to `canopy serve` (the image's CMD has none: its environment sets
# CANOPY_HOST=0.0.0.0 and CANOPY_PORT=8080).
#
#   docker run -p 8080:8080 canopy                          # demo models
#   docker run -p 8080:8080 -v $PWD/models:/models:ro canopy  # your models
#
# Environment (paths are variables so tests/deploy/test_image.py can run
# this script outside a container):
#   CANOPY_MODELS_MOUNT    where models are mounted (default /models)
#   CANOPY_DEMO_MODELS     the built-in models (default /opt/canopy/models)
#   CANOPY_REQUIRE_MODELS  1: refuse to start without mounted models
#                          (production: never serve demo models by mistake)
# Every other CANOPY_* variable is a daemon key (docs/daemon.md).
set -euo pipefail
mount=${CANOPY_MODELS_MOUNT:-/models}
demo=${CANOPY_DEMO_MODELS:-/opt/canopy/models}
if [ -d "$mount" ] && [ -n "$(ls -A "$mount")" ]; then
  models=$mount
elif [ "${CANOPY_REQUIRE_MODELS:-0}" = 1 ]; then
  echo "entrypoint: no models mounted at $mount and CANOPY_REQUIRE_MODELS=1" >&2
  exit 1
else
  echo "entrypoint: nothing mounted at $mount: serving the demo models" \
       "in $demo" >&2
  models=$demo
fi
# exec: the daemon is PID 1's replacement and gets SIGTERM itself (drain).
exec canopy serve --models-dir "$models" "$@"
