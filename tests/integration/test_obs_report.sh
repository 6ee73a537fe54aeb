#!/bin/sh
# test_obs_report.sh — scripts/cachalloc-report against files written by the
# C++ writers (test_obs_dumpgen): `summary` prints the table the library
# put in the dump (byte for byte what stats:stderr prints) and, when the
# dump has a "pinned_host" object (variant 1), its counters under PyTorch's
# names, `brief` says in sentences what the dump holds, `diff` compares two runs, `plot` draws a PNG (or, without
# matplotlib in this python3 or Debian's /usr/bin/python3, says so clearly
# and fails).
#   test_obs_report.sh DUMPGEN REPORT_SCRIPT
set -u
gen=$1
report=$2
command -v python3 >/dev/null 2>&1 || exit 77
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$gen" "$dir/a.json" "$dir/a-trace.json" "$dir/a-table.txt" 0 || fail "generator (variant 0)"
"$gen" "$dir/b.json" "$dir/b-trace.json" "$dir/b-table.txt" 1 || fail "generator (variant 1)"

python3 "$report" summary "$dir/a.json" > "$dir/a-py.txt" || fail "summary exited $?"
cmp "$dir/a-table.txt" "$dir/a-py.txt" || { diff "$dir/a-table.txt" "$dir/a-py.txt"; fail "summary differs from the C++ table"; }
grep -q 'Pinned host' "$dir/a-py.txt" && fail "summary of a dump without pinned_host shows pinned host lines"
# Variant 1's pinned host run (test_obs_dumpgen.cpp, pinned_run): 4 served,
# 1 cache hit, 3 driver allocations, 1 free over the limit, 64 KiB cached.
python3 "$report" summary "$dir/b.json" > "$dir/b-py.txt" || fail "summary exited $? (variant 1)"
head -c "$(wc -c < "$dir/b-table.txt")" "$dir/b-py.txt" | cmp - "$dir/b-table.txt" || fail "summary differs (variant 1)"
tail -c +"$(( $(wc -c < "$dir/b-table.txt") + 1 ))" "$dir/b-py.txt" > "$dir/b-host.txt"
head -2 "$dir/b-host.txt" | grep -q '^Pinned host memory (torch.cuda.host_memory_stats() names' \
  || { cat "$dir/b-host.txt"; fail "summary: no pinned host section after the table"; }
for row in 'allocated.allocated *4' 'allocated.current *1' 'num_host_alloc *3' 'num_cache_hits *1' \
           'num_over_limit_frees *1' 'cached_bytes *65,536' 'reserved_bytes.peak *204,800' 'host_alloc_time.count *3'; do
  grep -q "^  $row\$" "$dir/b-host.txt" || { cat "$dir/b-host.txt"; fail "summary: pinned host row '$row'"; }
done
[ "$(grep -c '^  ' "$dir/b-host.txt")" -eq "$(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["pinned_host"]))' "$dir/b.json")" ] \
  || fail "summary: not every pinned_host counter shown"

python3 "$report" diff "$dir/a.json" "$dir/b.json" > "$dir/diff.txt" || fail "diff exited $?"
grep -q '^device 0 ' "$dir/diff.txt" || fail "diff has no device 0 section"
grep -q '^device 1 ' "$dir/diff.txt" || fail "diff has no device 1 section"
grep -q '^num_cache_hits *- *1 *$' "$dir/diff.txt" || { cat "$dir/diff.txt"; fail "diff: pinned host rows"; }
[ "$(grep -c 'cachalloc CUDA memory summary, device ID' "$dir/a-py.txt")" -eq 2 ] || fail "summary: expected two device tables"
grep -q '^cuMemAlloc_v2 *120 *121 *+1$' "$dir/diff.txt" || { cat "$dir/diff.txt"; fail "diff: cuMemAlloc_v2 row"; }
grep -q '^allocation.all.allocated ' "$dir/diff.txt" || fail "diff: allocation row"
python3 "$report" diff --all "$dir/a.json" "$dir/a.json" > "$dir/same.txt" || fail "diff --all exited $?"
n=$(grep -c '  =$' "$dir/same.txt")
[ "$n" -ge 100 ] || fail "diff --all of a file with itself: $n equal rows, expected every stat"

python3 "$report" summary "$dir/a-trace.json" > /dev/null 2>&1 && fail "summary accepted a trace file"
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); del d["summary_table"]; json.dump(d, open(sys.argv[2], "w"))' \
  "$dir/a.json" "$dir/old.json" || fail "writing a dump without summary_table"
out=$(python3 "$report" summary "$dir/old.json" 2>&1) && fail "summary of a dump without its table succeeded"
echo "$out" | grep -q 'has no summary_table' || fail "summary without a table: unclear message: $out"

# brief: the generator's numbers (120 cuMemAlloc_v2; devices 0 and 1 served
# 80 + 40 with 58 + 36 driver allocations) in sentences, and the dump's path.
python3 "$report" brief "$dir/a.json" > "$dir/brief.txt" || fail "brief exited $?"
grep -q '^cachalloc intercepted 120 device allocations of test_obs_dumpgen (cuMemAlloc_v2 120)' "$dir/brief.txt" \
  || { cat "$dir/brief.txt"; fail "brief: intercepted line"; }
grep -q '^26 of the 120 allocations it served (22 %) came from its cache; it asked the driver for memory 94 times on 2 devices' \
  "$dir/brief.txt" || { cat "$dir/brief.txt"; fail "brief: cache line"; }
grep -q "^Passed to the driver untouched: 3 (foreign_pointer)" "$dir/brief.txt" || fail "brief: passthrough line"
# issue 37: a free of a null pointer is no free, and the driver time is not
# divided into a per-call cost its event calls would distort.
python3 - "$dir/a.json" "$dir/nullfree.json" <<'PY' || fail "writing the null-free dump"
import json, sys
d = json.load(open(sys.argv[1]))
freed = sum(x["stats"]["allocation.all.freed"] for x in d["devices"])
d["interposer"]["calls"]["cuMemFree_v2"] = freed + 1          # one cuMemFree(0)
d["interposer"]["driver_calls"] = 73
d["interposer"]["ns_in_driver"] = 226_300
d["interposer"]["driver_calls_by"] = {"cuMemAlloc_v2": 7, "cuEventRecord": 40, "cuEventQuery": 20,
                                     "cuCtxWaitEvent": 6}
json.dump(d, open(sys.argv[2], "w"))
print(freed)
PY
freed=$(python3 -c 'import json,sys; print(sum(x["stats"]["allocation.all.freed"] for x in json.load(open(sys.argv[1]))["devices"]))' "$dir/a.json")
python3 "$report" brief "$dir/nullfree.json" > "$dir/brief-null.txt" || fail "brief exited $? (null free)"
grep -q "^cachalloc intercepted 120 device allocations of test_obs_dumpgen (cuMemAlloc_v2 120) and $freed frees" \
  "$dir/brief-null.txt" || { cat "$dir/brief-null.txt"; fail "brief: a free of a null pointer counted as a free"; }
grep -q "1 free call of a null pointer or of memory cachalloc did not allocate" "$dir/brief-null.txt" ||
  { cat "$dir/brief-null.txt"; fail "brief: the null free is not said"; }
grep -q "^Its 73 driver calls (66 of them event calls) took 0.226 ms" "$dir/brief-null.txt" ||
  { cat "$dir/brief-null.txt"; fail "brief: driver call sentence"; }
grep -q "us each" "$dir/brief-null.txt" && fail "brief: a per-call average over event calls"
grep -qF "Full statistics: $dir/a.json" "$dir/brief.txt" || fail "brief: no path to the dump"
grep -q 'Pinned host' "$dir/brief.txt" && fail "brief: pinned host sentence without pinned_host"
python3 "$report" brief "$dir/b.json" > "$dir/brief-b.txt" || fail "brief exited $? (variant 1)"
grep -q '^Pinned host memory: 4 allocations served, 1 from its cache; 3 driver allocations and 1 driver frees (.* allocating); 65,536 bytes cached at exit.$' \
  "$dir/brief-b.txt" || { cat "$dir/brief-b.txt"; fail "brief: pinned host sentence"; }
python3 "$report" brief "$dir/a-trace.json" > /dev/null 2>&1 && fail "brief accepted a trace file"

if python3 -c 'import matplotlib' 2>/dev/null || /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  python3 "$report" plot "$dir/a-trace.json" -o "$dir/t.png" || fail "plot exited $?"
  head -c 8 "$dir/t.png" | od -An -c | grep -q 'P   N   G' || fail "plot did not write a PNG"
else
  out=$(python3 "$report" plot "$dir/a-trace.json" -o "$dir/t.png" 2>&1) && fail "plot without matplotlib succeeded"
  echo "$out" | grep -q 'needs matplotlib' || fail "plot without matplotlib: unclear message: $out"
fi
echo "ok"
