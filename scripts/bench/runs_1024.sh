# runs_1024.sh - sourced by the benchmarks that time one run of 1,024
# instances (memory.sh, in_place.sh): for each FAMILY:H:DATA of $CASES, a
# seeded model in $WORK/FAMILY-H (H hidden and embedding floats, 5
# classes, the vocabulary of data/DATA.jsonl) and the data's
# instances repeated to 1,024 in $WORK/DATA-1024.jsonl; first, the
# table's header line (the machine, its load and the settings).
# Needs CANOPY, PY, DATA, WORK, CASES, THREADS, POLICY and REPEAT set.
runs_1024_init() {
  local c fam h data
  echo "# $(date -u +%F' '%H:%M) UTC, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}; runs of 1,024, --jobs 1 --threads $THREADS, policy $POLICY, median of $REPEAT"
  for c in $CASES; do
    IFS=: read -r fam h data <<<"$c"
    $CANOPY model init "$fam" "$WORK/$fam-$h" --hidden "$h" --embed "$h" \
      --classes 5 --vocab-from "$DATA/$data.jsonl" >/dev/null 2>&1 ||
      { echo "init $fam failed" >&2; return 1; }
    [ -f "$WORK/$data-1024.jsonl" ] || $PY -c 'import sys
l = open(sys.argv[1]).read().splitlines()
print("\n".join((l * (1024 // len(l) + 1))[:1024]))' "$DATA/$data.jsonl" \
      >"$WORK/$data-1024.jsonl"
  done
}
