#!/usr/bin/env bash
# The test command (README, .ci/run): installs the Debian packages, builds,
# runs every test, then runs the whole suite again under AddressSanitizer
# and UndefinedBehaviorSanitizer. Ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh || exit 1
export CANOPY_DATA=${CANOPY_DATA:-$PWD/data} # the tests' data (data/README.md)

status=0
run_suite() { # build-dir, meson setup options...
  local dir=$1
  shift
  if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" "$@" >"$dir.setup.log" 2>&1 \
      || { cat "$dir.setup.log"; return 1; }
  else  # e.g. scripts/demo.sh's build/, configured without the tests
    meson configure "$dir" -Dtests=true "$@" >"$dir.setup.log" 2>&1 \
      || { cat "$dir.setup.log"; return 1; }
  fi
  ninja -C "$dir" || return 1
  meson test -C "$dir" --print-errorlogs --num-processes 2 || return 1
}

echo "== release build"
run_suite build -Dcuda=auto || status=1
echo "== sanitizer build (address, undefined)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp:print_suppressions=0
run_suite build-asan -Db_sanitize=address,undefined \
  -Dbuildtype=debugoptimized -Db_lundef=false -Dcuda=disabled || status=1

/usr/bin/python3 - build build-asan <<'PY'
import json, sys, os
ok = bad = skip = 0
for d in sys.argv[1:]:
    p = os.path.join(d, "meson-logs", "testlog.json")
    if not os.path.exists(p):
        bad += 1
        continue
    for line in open(p):
        r = json.loads(line)["result"]
        if r in ("OK", "EXPECTEDFAIL"): ok += 1
        elif r == "SKIP": skip += 1
        else: bad += 1
print(f"{ok} passed, {bad} failed" + (f", {skip} skipped" if skip else ""))
PY
exit $status
