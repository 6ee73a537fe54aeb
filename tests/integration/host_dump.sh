#!/bin/sh
# host_dump.sh — the pinned host cache's statistics in the stats dump: the
# route program's host_served behaviour runs under the shim with
# CACHALLOC_CONF=stats:PATH, and its "pinned_host" object must say what it
# did (4 pinned allocations, 2 from the driver, 2 cache hits, all freed), and
# stats:stderr's table carries the pinned host rows.
#   host_dump.sh ROUTE_PROG LIBCACHALLOC FAKE_LIBCUDA_DIR
set -u
prog=$1
shim=$2
fakedir=$3
command -v python3 >/dev/null 2>&1 || exit 77
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

env LD_PRELOAD="$shim" LD_LIBRARY_PATH="$fakedir" CACHALLOC_CONF="pinned_max_cached_mb:4096,stats:$dir/s.json" "$prog" host_served \
  || fail "host_served failed"
python3 - "$dir/s.json" <<'PY' || fail "pinned_host does not match the program"
import json, sys
h = json.load(open(sys.argv[1]))["pinned_host"]
assert h["allocated.allocated"] == 4, h
assert h["allocated.current"] == 0, h
assert h["num_host_alloc"] == 2, h
assert h["num_cache_hits"] == 2, h
assert h["num_host_free"] == 0, h
assert h["segment.current"] == 2, h
assert h["reserved_bytes.current"] == 16384, h
assert h["host_alloc_time.count"] == 2, h
PY
env LD_PRELOAD="$shim" LD_LIBRARY_PATH="$fakedir" CACHALLOC_CONF="pinned_max_cached_mb:4096,stats:stderr" "$prog" host_served 2> "$dir/err.txt" \
  || fail "host_served failed with stats:stderr"
grep -q "Pinned host: driver allocs / frees .* 2 / 0" "$dir/err.txt" || { cat "$dir/err.txt"; fail "no pinned host rows"; }
echo PASS
