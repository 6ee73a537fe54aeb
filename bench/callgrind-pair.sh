#!/usr/bin/env bash
# callgrind-pair.sh — instructions per cached malloc+free pair through the
# shim on the fake driver: the deterministic measure the hot path is tuned
# against (docs/BENCHMARKS.md).  Runs bench/callgrind_pair under valgrind's
# callgrind twice (PAIRS and 2*PAIRS) and divides the difference, so
# start-up and exit cancel out.
#   bench/callgrind-pair.sh [BUILD_DIR] [PAIRS]
set -euo pipefail
build=${1:-build}
pairs=${2:-20000}
lib=$build/shim/libcachalloc.so
prog=$build/bench/callgrind_pair
fake=$build/tests/fake
command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# instructions MODE N SIZE: total instructions callgrind counted.
instructions() {
  LD_PRELOAD=$lib LD_LIBRARY_PATH=$fake CACHALLOC_CONF=${CACHALLOC_CONF:-} \
    valgrind --tool=callgrind --callgrind-out-file="$tmp/out" "$prog" "$1" "$2" "$3" >/dev/null 2>"$tmp/err" ||
    { cat "$tmp/err" >&2; exit 1; }
  awk '/^(summary|totals):/ {print $2; exit}' "$tmp/out"
}

printf '| case | size | instructions per pair |\n| --- | --- | --- |\n'
for mode in plain blocking nonblocking async; do
  for size in 512 1048576 67108864; do
    a=$(instructions "$mode" "$pairs" "$size")
    b=$(instructions "$mode" $((2 * pairs)) "$size")
    printf '| %s | %s | %d |\n' "$mode" "$size" $(((b - a) / pairs))
  done
done
