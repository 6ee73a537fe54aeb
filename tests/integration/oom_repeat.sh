#!/bin/sh
# oom_repeat.sh — an out-of-memory condition that refuses every allocation
# for the same configured reason is reported once, then counted: the
# README's example under per_process_memory_fraction:0.001 on the fake
# driver's 1 GiB device (every segment, 2 MiB or more, is above the 1.02 MiB
# cap).  Checks: one full message, one summary line at exit whose count is
# the dump's num_ooms and whose recommendation serves the largest request
# (64 MiB: at least 0.063), the same in the dump's repeated_ooms.
#   oom_repeat.sh LAUNCHER DRIVER_PATTERNS FAKE_LIBCUDA_DIR
set -u
launcher=$1 example=$2 fake_dir=$3
fail() { echo "oom_repeat: FAIL: $*"; exit 1; }
command -v python3 >/dev/null 2>&1 || exit 77
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

LD_LIBRARY_PATH="$fake_dir" FAKE_CUDA_TOTAL_MB=1024 CACHALLOC_CONF= \
  "$launcher" --conf "per_process_memory_fraction:0.001,stats:$dir/dump.json" -- "$example" \
  >"$dir/out.txt" 2>"$dir/err.txt"
[ -s "$dir/dump.json" ] || { cat "$dir/err.txt"; fail "no dump"; }
n=$(grep -c 'CUDA out of memory' "$dir/err.txt")
[ "$n" -eq 1 ] || fail "$n out-of-memory messages, expected 1 ($(wc -c <"$dir/err.txt") bytes of stderr)"
grep -q 'Raise per_process_memory_fraction to at least 0.002' "$dir/err.txt" || fail "the first message's remedy"
grep -q 'Later out-of-memory errors on device 0 for this reason are counted, not printed' "$dir/err.txt" \
  || fail "the first message does not say that the rest are counted"
ooms=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["devices"][0]["stats"]["num_ooms"])' "$dir/dump.json")
[ "$ooms" -gt 100 ] || fail "only $ooms out-of-memory errors: the example should fail every allocation"
grep -q "per_process_memory_fraction:0.001 (1.02 MiB of device 0) refused $ooms allocations .* the largest needed a 64.00 MiB segment: to serve every one of them, raise per_process_memory_fraction to at least 0.063" \
  "$dir/err.txt" || { cat "$dir/err.txt"; fail "no summary line at exit with the count ($ooms) and 0.063"; }
python3 - "$dir/dump.json" "$ooms" <<'PY' || fail "the dump's repeated_ooms"
import json, sys
dump = json.load(open(sys.argv[1]))
reps = dump["repeated_ooms"]
assert len(reps) == 1, reps
r = reps[0]
assert (r["device"], r["reason"], r["count"], r["largest_need"]) == (0, "per_process_memory_fraction", int(sys.argv[2]), 64 << 20), r
assert "at least 0.063" in r["summary"], r["summary"]
PY
echo "ok: $ooms out-of-memory errors, one message and one summary ($(wc -c <"$dir/err.txt") bytes of stderr)"
