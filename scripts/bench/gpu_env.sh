# gpu_env.sh - what the GPU scripts (gpu_run.sh, gpu_compare.sh,
# gpu_host.sh) need, taken from the environment and checked before any
# step runs, so that they work on any machine with a GPU and a build.
# Sourced, not run. Sets B (the canopy binary), D (the data directory),
# TEST_CUDA (test_cuda, or empty), OLD_B and OLD_MODULE (an older build,
# or empty), OUT (the log directory) and ROOT (the checkout), every path
# absolute, and moves to ROOT (the scripts name scripts/bench/gpu.py).

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# The text every GPU script's --help prints after its own.
gpu_env_help() {
  cat <<'EOF'

What it needs (environment):
  CANOPY_BIN         canopy built with `meson setup BUILD -Dcuda=enabled`
                     (default: build-cuda/canopy of this checkout)
  LD_LIBRARY_PATH    where the loader finds the libraries canopy links
                     (CUDA runtime, cuBLAS, jansson, ...) when they are not
                     in the system's paths; checked with ldd before a step
  CANOPY_CUDA_MODULE the cuda backend's module (libcanopy-cuda.so); default:
                     backends/cuda/ beside CANOPY_BIN when it is there (a
                     build directory copied to another path), else the
                     path compiled into the binary
  CANOPY_TEST_CUDA   test_cuda (default: tests/test_cuda beside CANOPY_BIN;
                     the step is skipped, saying so, if there is none)
  CANOPY_DATA        the data files (default: this checkout's data/)
  OUT                where logs go (default: gpu-out)
  CANOPY_OLD_BIN     an older canopy to compare with (gpu_compare.sh,
                     gpu_host.sh; their steps on it are skipped without)
  CANOPY_OLD_CUDA_MODULE  its cuda module (default: backends/cuda/ beside it)
  and nvidia-smi, python3 with torch for scripts/bench/gpu.py.
Example, from the checkout:
  meson setup build-cuda -Dcuda=enabled && ninja -C build-cuda
  CANOPY_BIN=build-cuda/canopy scripts/bench/gpu_run.sh quick
EOF
}

# A binary whose libraries the loader cannot all find: which, and exit.
gpu_env_ldd() {
  local missing
  missing=$(ldd "$1" 2>&1 | grep 'not found')
  if [ -n "$missing" ]; then
    echo "$1: libraries the loader cannot find (set LD_LIBRARY_PATH):" >&2
    echo "$missing" >&2
    exit 2
  fi
}

# Resolve and check everything; exit 2 with what is missing.
# A GPU script's start, given its arguments: --help prints the script's
# head comment (all but the line that points here) and what it needs, and
# exits; otherwise gpu_env.
gpu_start() {
  if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then
    awk 'NR > 1 && !/^#/ { exit }
         NR > 1 && !/^#$/ && !/What it needs/' "$0" | sed 's/^# \{0,1\}//'
    gpu_env_help
    exit 0
  fi
  gpu_env
}

gpu_env() {
  CANOPY_BIN=${CANOPY_BIN:-$ROOT/build-cuda/canopy}
  if [ ! -x "$CANOPY_BIN" ]; then
    echo "no canopy binary at $CANOPY_BIN: set CANOPY_BIN (--help)" >&2
    exit 2
  fi
  B=$(realpath -m "$CANOPY_BIN")
  gpu_env_ldd "$B"
  local dir module
  dir=$(dirname "$B")
  module=$dir/backends/cuda/libcanopy-cuda.so
  if [ -z "${CANOPY_CUDA_MODULE:-}" ] && [ -f "$module" ]; then
    export CANOPY_CUDA_MODULE=$module
  elif [ -n "${CANOPY_CUDA_MODULE:-}" ]; then
    export CANOPY_CUDA_MODULE=$(realpath -m "$CANOPY_CUDA_MODULE")
  fi
  if [ -n "${CANOPY_CUDA_MODULE:-}" ]; then gpu_env_ldd "$CANOPY_CUDA_MODULE"; fi
  TEST_CUDA=$(realpath -m "${CANOPY_TEST_CUDA:-$dir/tests/test_cuda}")
  [ -x "$TEST_CUDA" ] || TEST_CUDA=
  export CANOPY_DATA=$(realpath -m "${CANOPY_DATA:-$ROOT/data}")
  D=$CANOPY_DATA
  if [ ! -f "$D/trees-binary.jsonl" ]; then
    echo "no trees-binary.jsonl in $D: set CANOPY_DATA (--help)" >&2
    exit 2
  fi
  if ! command -v nvidia-smi >/dev/null; then
    echo "no nvidia-smi: this needs a machine with an NVIDIA GPU" >&2
    exit 2
  fi
  OUT=$(realpath -m "${OUT:-gpu-out}")
  mkdir -p "$OUT"
  # An older build to compare with (gpu_compare.sh, gpu_host.sh).
  OLD_B=${CANOPY_OLD_BIN:+$(realpath -m "$CANOPY_OLD_BIN")}
  OLD_MODULE=${CANOPY_OLD_CUDA_MODULE:+$(realpath -m "$CANOPY_OLD_CUDA_MODULE")}
  if [ -n "$OLD_B" ] && [ -z "$OLD_MODULE" ]; then
    OLD_MODULE=$(dirname "$OLD_B")/backends/cuda/libcanopy-cuda.so
  fi
  cd "$ROOT" || exit 2
}

# Print a step's heading.
step() { echo "== $* ($(date +%T))"; }
