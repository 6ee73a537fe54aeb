#!/usr/bin/env bash
# stress-loop.sh — runs the threaded stress test (tests/stress/stress.cpp) on
# the fake libcuda over and over, several at once, to catch rare interleavings
# (docs/RELIABILITY.md).  More processes than cores is the point: preemption
# inside the allocator's windows is what a loaded CI machine gives.
#
#   scripts/stress-loop.sh [-b BUILD] [-j PARALLEL] [-t SECONDS] [-o DIR] [-c CONF] [-- STRESS ARGS]
#
# Defaults: build/, 2 x cores in parallel, 300 s, out /tmp/stress-loop,
# CACHALLOC_CONF=expandable_segments:true, stress --epochs 120; each run's seed
# is its number.  Failing runs' output is kept as DIR/fail-<run>.log; the
# last line printed is "N runs, F failed".  Exit status 1 when any failed.
set -uo pipefail
cd "$(dirname "$0")/.."

build=build parallel=$(($(nproc) * 2)) seconds=300 out=/tmp/stress-loop conf=expandable_segments:true
while getopts "b:j:t:o:c:" opt; do
  case $opt in
    b) build=$OPTARG ;;
    j) parallel=$OPTARG ;;
    t) seconds=$OPTARG ;;
    o) out=$OPTARG ;;
    c) conf=$OPTARG ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ "${1:-}" = "--" ] && shift
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--epochs 120)

stress=$build/tests/stress/stress
for f in "$stress" "$build/shim/libcachalloc.so" "$build/tests/fake/libcuda.so.1"; do
  [ -e "$f" ] || { echo "stress-loop: $f is missing: build first (ninja -C $build)" >&2; exit 2; }
done
mkdir -p "$out"
rm -f "$out"/fail-*.log "$out"/runs
deadline=$((SECONDS + seconds))

# One worker: runs until the deadline, numbering its runs worker, worker+P, ...
worker() {
  local run=$1
  while [ $SECONDS -lt $deadline ]; do
    local log
    log=$(LD_PRELOAD=$build/shim/libcachalloc.so CACHALLOC_CONF=$conf \
      LD_LIBRARY_PATH=$build/tests/fake:$build/shim FAKE_CUDA_TOTAL_MB=4096 MALLOC_PERTURB_=$((run % 255 + 1)) \
      timeout 900 "$stress" "${args[@]}" --seed "$run" 2>&1)
    local rc=$?
    echo "$run $rc" >>"$out"/runs
    [ $rc -ne 0 ] && printf '%s\n' "seed $run rc $rc" "$log" >"$out/fail-$run.log"
    run=$((run + parallel))
  done
}
for w in $(seq 1 "$parallel"); do worker "$w" & done
wait
runs=$(wc -l <"$out"/runs)
failed=$(awk '$2 != 0' "$out"/runs | wc -l)
for f in "$out"/fail-*.log; do [ -e "$f" ] && { echo "== $f"; cut -c1-600 "$f"; }; done
echo "$runs runs, $failed failed"
[ "$failed" -eq 0 ]
