#!/usr/bin/env bash
# stress_ci.sh - the test suite on a busy machine: K rounds of `meson test`
# with N busy loops (shell loops that spin a core each) running beside
# them, then how many rounds each test passed and one line "P passed,
# F failed" over every test run. A test that fails only here races the
# clock somewhere (docs/testing.md: tests wait on events, never on time);
# fix the test, do not retry it.
#
# usage: scripts/stress_ci.sh [-n BUSY] [-k ROUNDS] [-C BUILDDIR]
#                             [-j PROCESSES] [-r] [TEST|daemon ...]
#   -n BUSY       busy loops beside the tests (default: 2 x the cores)
#   -k ROUNDS     rounds of the suite (default: 3)
#   -C BUILDDIR   the meson build directory (default: build)
#   -j PROCESSES  meson test --num-processes (default: meson's)
#   -r            run the build as it is (default: ninja brings it up to
#                 date first; -r for a build of only the tests named)
#   TEST ...      meson test names (default: the whole suite); `daemon`
#                 stands for the daemon's tests: test_http_limits,
#                 test_http_pipeline, test_serve*, test_lifecycle
#                 (test_serve_decode among the test_serve*)
#   MESON_TEST_ARGS  more arguments to meson test (e.g. --setup NAME)
# Exit status: 0 when every run passed, 1 otherwise, 2 on a usage error.
# The busy loops end with the script, on Ctrl-C or any exit.
set -u
cd "$(dirname "$0")/.."
BUSY=$((2 * $(nproc))) ROUNDS=3 BUILD=build JOBS= REBUILD=1
case ${1:-} in --help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
while getopts "n:k:C:j:rh" o; do
  case $o in
    n) BUSY=$OPTARG ;;
    k) ROUNDS=$OPTARG ;;
    C) BUILD=$OPTARG ;;
    j) JOBS=$OPTARG ;;
    r) REBUILD= ;;
    h) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
# as scripts/test.sh runs the tests (a sanitizer build reads these)
export CANOPY_DATA=${CANOPY_DATA:-$PWD/data}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp:print_suppressions=0}
if [ ! -f "$BUILD/build.ninja" ]; then
  echo "stress_ci.sh: no meson build in $BUILD (-C BUILDDIR)" >&2
  exit 2
fi

# The test names: `daemon` expands to the daemon's tests this build has.
tests=()
for t in "$@"; do
  if [ "$t" = daemon ]; then
    while read -r name; do
      case $name in
        test_http_limits|test_http_pipeline|test_serve*|test_lifecycle)
          tests+=("$name") ;;
      esac
    done < <(meson test -C "$BUILD" --no-rebuild --list 2>/dev/null | sed 's/^.* \/ //')
  else
    tests+=("$t")
  fi
done

pids=() mpid=
stop_busy() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  pids=()
}
# On Ctrl-C: the busy loops go, and meson test is told to stop (SIGTERM:
# it ends the tests it runs), then the script exits.
interrupted() {
  stop_busy
  if [ -n "$mpid" ]; then kill -TERM "$mpid" 2>/dev/null; wait "$mpid"; fi
  echo "stress_ci: interrupted" >&2
  exit 130
}
trap stop_busy EXIT
trap interrupted INT TERM

if [ -n "$REBUILD" ]; then ninja -C "$BUILD" >/dev/null || exit 1; fi
for _ in $(seq "$BUSY"); do
  (while :; do :; done) &
  pids+=($!)
done
echo "stress_ci: $ROUNDS round(s) of ${tests[*]:-the whole suite}, $BUSY busy" \
     "loop(s) beside them, $(nproc) core(s)"

logs=()
for r in $(seq "$ROUNDS"); do
  base=stress-round$r
  # in the background, so that a Ctrl-C reaches the trap at once
  # shellcheck disable=SC2086  # MESON_TEST_ARGS is a list of words
  meson test -C "$BUILD" --no-rebuild --logbase "$base" \
    ${JOBS:+--num-processes "$JOBS"} ${MESON_TEST_ARGS:-} "${tests[@]}" \
    >"$BUILD/meson-logs/$base.out" 2>&1 &
  mpid=$!
  wait "$mpid"
  mpid=
  echo "round $r: $(grep -E '^(Ok|Fail|Timeout):' "$BUILD/meson-logs/$base.out" |
                     tr -s ' ' | paste -sd' ')"
  logs+=("$BUILD/meson-logs/$base.json")
done
stop_busy

# Per test: the rounds it passed (OK or EXPECTEDFAIL; SKIP counted apart),
# and the totals.
/usr/bin/python3 - "${logs[@]}" <<'PY'
import collections, json, sys
passed, runs, failed = collections.Counter(), collections.Counter(), []
skipped = collections.Counter()
good = {"OK", "EXPECTEDFAIL"}
for r, path in enumerate(sys.argv[1:], 1):
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        print(f"round {r}: no test log ({e})")
        continue
    for line in lines:
        t = json.loads(line)
        runs[t["name"]] += 1
        if t["result"] in good:
            passed[t["name"]] += 1
        elif t["result"] == "SKIP":
            skipped[t["name"]] += 1
        else:
            failed.append(f"round {r}: {t['name']} {t['result']}")
w = max((len(n) for n in runs), default=4)
print(f"{'test':<{w}}  passed/rounds")
for n in sorted(runs):
    print(f"{n:<{w}}  {passed[n]}/{runs[n]}"
          + (f" ({skipped[n]} skipped)" if skipped[n] else ""))
for f in failed:
    print(f)
p, f, s = sum(passed.values()), len(failed), sum(skipped.values())
print(f"{p} passed, {f} failed" + (f", {s} skipped" if s else ""))
sys.exit(1 if f or not runs else 0)
PY
