#!/usr/bin/env bash
# fuzz.sh - runs every libFuzzer target (tests/fuzz/fuzz_*.c) for SECONDS
# each under AddressSanitizer and UndefinedBehaviorSanitizer, starting from
# its committed seed corpus, and prints a table: executions, coverage,
# corpus growth, crashes. New inputs go to build-fuzz/corpus/NAME (not
# committed); a crash leaves build-fuzz/crash-NAME-* to reproduce with
#   build-fuzz/tests/fuzz_NAME FILE
# and, once fixed, to add to tests/fuzz/corpus_NAME (replayed by the tests).
# usage: scripts/fuzz.sh [SECONDS] [NAME...]      (default 60 s, all)
set -uo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  names=(tree instance line model config http cells bodyscan)
  # the gRPC front end's target exists where meson's grpc feature is on
  pkg-config --exists libnghttp2 libprotobuf-c && command -v protoc-c \
    >/dev/null && names+=(grpc)
fi
command -v clang >/dev/null || { echo "fuzz.sh: needs clang (apt-get install clang)" >&2; exit 2; }
if [ ! -f build-fuzz/build.ninja ]; then
  CC=clang meson setup build-fuzz -Dfuzzing=true -Dcuda=disabled \
    -Db_sanitize=address,undefined -Db_lundef=false \
    -Dbuildtype=debugoptimized >build-fuzz.setup.log 2>&1 \
    || { cat build-fuzz.setup.log; exit 1; }
fi
ninja -C build-fuzz $(printf 'tests/fuzz_%s ' "${names[@]}") >/dev/null || exit 1
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
printf '| target | seconds | executions | exec/s | coverage (edges) | corpus (seeds -> now) | crashes |\n'
printf '|---|---:|---:|---:|---:|---:|---:|\n'
status=0
for n in "${names[@]}"; do
  work=build-fuzz/corpus/$n
  mkdir -p "$work"
  seeds=$(ls tests/fuzz/corpus_$n | wc -l)
  log=build-fuzz/fuzz-$n.log
  build-fuzz/tests/fuzz_$n -max_total_time="$secs" -print_final_stats=1 \
    -artifact_prefix=build-fuzz/crash-$n- -timeout=10 -rss_limit_mb=2048 \
    "$work" tests/fuzz/corpus_$n >"$log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
  speed=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$')
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | grep -o '[0-9]*')
  crashes=$(ls build-fuzz/crash-$n-* 2>/dev/null | wc -l)
  [ $rc -eq 0 ] || status=1
  printf '| %s | %s | %s | %s | %s | %s -> %s | %s |\n' "$n" "$secs" \
    "${execs:-?}" "${speed:-?}" "${cov:-?}" "$seeds" \
    "$(( $(ls "$work" | wc -l) + seeds ))" "$crashes"
done
exit $status
