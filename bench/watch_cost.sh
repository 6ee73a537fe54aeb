#!/usr/bin/env bash
# watch_cost.sh — the cost of watching every stream-naming entry point
# (issue 34 item 1), one table from one run: bench/watch_cost's four modes
# bare, under an earlier libcachalloc.so (OLD_LIB, optional: the tree before
# the generated wrappers), under this tree's (auto), and under this tree's
# with free_sync:fence (what fencing every free instead of watching would
# cost).  Contenders interleaved, ROUNDS rounds; medians with [min–max].
#   bench/watch_cost.sh [BUILD_DIR] [N] [ROUNDS]     (OLD_LIB=path/libcachalloc.so)
# Prints a markdown table: mode × contender: ns per iteration, peak MiB
# above the start, and for cachalloc the driver calls per free from its dump.
set -uo pipefail
build=${1:-build}
n=${2:-20000}
rounds=${3:-3}
prog=$build/bench/watch_cost
lib=$build/shim/libcachalloc.so
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
[ -x "$prog" ] || { echo "no $prog (needs nvcc)" >&2; exit 1; }

contenders="bare new fence"
[ -n "${OLD_LIB:-}" ] && [ -f "$OLD_LIB" ] && contenders="bare old new fence"

# run CONTENDER MODE ROUND: appends "ns peak calls_per_free" to $tmp/CONTENDER.MODE
run() {
  local c=$1 mode=$2 r=$3 dump=$tmp/$1.$2.$3.json out
  case $c in
    bare) out=$("$prog" "$mode" "$n") ;;
    old) out=$(LD_PRELOAD=$OLD_LIB CACHALLOC_CONF="stats:$dump" "$prog" "$mode" "$n") ;;
    new) out=$(LD_PRELOAD=$lib CACHALLOC_CONF="stats:$dump" "$prog" "$mode" "$n") ;;
    fence) out=$(LD_PRELOAD=$lib CACHALLOC_CONF="stats:$dump,free_sync:fence" "$prog" "$mode" "$n") ;;
  esac || { echo "$c $mode failed" >&2; return; }
  local calls="- -"
  [ -f "$dump" ] && calls=$(python3 - "$dump" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
def find(o, k):
    if isinstance(o, dict):
        if k in o: return o[k]
        for v in o.values():
            r = find(v, k)
            if r is not None: return r
    if isinstance(o, list):
        for v in o:
            r = find(v, k)
            if r is not None: return r
calls = find(d, "driver_calls") or 0
c = find(d, "calls") or {}
frees = sum(c.get(k, 0) for k in ("cuMemFree_v2", "cudaFree", "cuMemFreeAsync", "cuMemFreeAsync_ptsz", "cudaFreeAsync"))
peak = find(d, "reserved_bytes.all.peak") or 0
print(f"{calls / frees:.3f}" if frees else f"{calls}/0", f"{peak / 1048576:.1f}")
EOF
)
  # ns, peak MiB (bare: the program's cudaMemGetInfo samples; cachalloc: its
  # reserved peak, since it answers cudaMemGetInfo itself), calls per free
  set -- $calls
  local peak=$(echo "$out" | awk '{print $3}')
  [ "$2" != "-" ] && peak=$2
  echo "$(echo "$out" | awk '{print $2}') $peak $1" >>"$tmp/$c.$mode"
}

for r in $(seq "$rounds"); do
  for mode in launch event single threads; do
    for c in $contenders; do run "$c" "$mode" "$r"; done
  done
done

summarize() {  # FILE COLUMN: median [min–max]
  sort -n -k"$2","$2" "$1" | awk -v c="$2" '{v[NR]=$c} END {if (NR==0) {print "-"; exit}
    m = (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2; printf "%s [%s–%s]", m, v[1], v[NR]}'
}
echo "| mode | contender | ns per iteration | peak MiB (bare: in use; cachalloc: reserved) | driver calls per free |"
echo "| --- | --- | --- | --- | --- |"
for mode in launch event single threads; do
  for c in $contenders; do
    f=$tmp/$c.$mode
    [ -f "$f" ] || continue
    echo "| $mode | $c | $(summarize "$f" 1) | $(summarize "$f" 2) | $(tail -1 "$f" | awk '{print $3}') |"
  done
done
