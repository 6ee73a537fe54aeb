#!/bin/sh
# test_obs_shim.sh — observability through the real shim: test_obs_prog runs
# with libcachalloc.so preloaded over the fake libcuda.so.1, and its dump is
# read back and checked against what it did (N allocations of (i+1)*1000
# bytes, the even ones freed); the dump is also written on SIGTERM (and the
# program still dies of SIGTERM); a program that never used CUDA writes
# nothing; stats:stderr prints the table; an unwritable path is one warning.
#   test_obs_shim.sh PROG LIBCACHALLOC FAKE_LIBCUDA_DIR
set -u
prog=$1
shim=$2
fakedir=$3
command -v python3 >/dev/null 2>&1 || exit 77
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
N=10

run() {  # run CONF MODE: runs the program under the shim, stdout/stderr to $dir
  env LD_PRELOAD="$shim" LD_LIBRARY_PATH="$fakedir" CACHALLOC_CONF="$1" FAKE_CUDA_ALLOC_DELAY_US=2000 "$prog" "$2" "$N" \
    > "$dir/out.txt" 2> "$dir/err.txt"
}

check_dump() {  # check_dump FILE: numbers equal what the program did
  python3 - "$1" "$N" <<'PY' || fail "dump $1 does not match the program"
import json, sys
d = json.load(open(sys.argv[1]))
n = int(sys.argv[2])
freed = (n + 1) // 2
calls = d["interposer"]["calls"]
assert calls["cuMemAlloc_v2"] == n, calls
assert calls["cuMemFree_v2"] == freed, calls
assert len(d["devices"]) == 1, d["devices"]
s = d["devices"][0]["stats"]
assert s["allocation.all.allocated"] == n, s["allocation.all.allocated"]
assert s["allocation.all.current"] == n - freed, s["allocation.all.current"]
assert s["requested_bytes.all.allocated"] == sum((i + 1) * 1000 for i in range(n))
assert s["requested_bytes.all.current"] == sum((i + 1) * 1000 for i in range(1, n, 2))
assert s["num_ooms"] == 0
assert d["devices"][0]["derived"]["device_allocations_avoided"] == n - s["num_device_alloc"]
assert "test_obs_prog" in d["command_line"], d["command_line"]
# the driver calls the cache made are timed apart (each fake cuMemAlloc
# sleeps FAKE_CUDA_ALLOC_DELAY_US = 2000 us): a part of the time inside
inter = d["interposer"]
assert s["num_device_alloc"] >= 1
assert inter["driver_calls"] >= s["num_device_alloc"], inter
assert inter["ns_in_driver"] >= s["num_device_alloc"] * 2_000_000, inter
assert inter["ns_in_driver"] <= inter["ns_inside"], inter
assert d["config"].startswith("") and "stats:" in d["config"], d["config"]
PY
}

# exit(), return from main
for mode in exit return; do
  run "stats:$dir/stats-$mode-%p.json" $mode || fail "$mode: program exited $?"
  grep -qx done "$dir/out.txt" || fail "$mode: program output lost"
  f=$(ls "$dir"/stats-$mode-*.json 2>/dev/null)
  [ -n "$f" ] || { cat "$dir/err.txt"; fail "$mode: no dump written"; }
  check_dump "$f"
done

# SIGTERM: dump written, and the program still dies of SIGTERM (143 = 128+15)
run "stats:$dir/stats-term.json" sigterm
rc=$?
[ "$rc" -eq 143 ] || fail "sigterm: exit status $rc, expected 143"
[ -f "$dir/stats-term.json" ] || { cat "$dir/err.txt"; fail "sigterm: no dump written"; }
check_dump "$dir/stats-term.json"

# never used CUDA: nothing written
run "stats:$dir/stats-nocuda.json,trace:$dir/trace-nocuda.json" nocuda || fail "nocuda: exited $?"
[ ! -e "$dir/stats-nocuda.json" ] && [ ! -e "$dir/trace-nocuda.json" ] || fail "nocuda: a file was written"
[ ! -s "$dir/err.txt" ] || fail "nocuda: stderr not empty: $(cat "$dir/err.txt")"

# stats:stderr: the table, and the program's stdout intact
run "stats:stderr" exit || fail "stderr: exited $?"
grep -qx done "$dir/out.txt" || fail "stderr: program output lost"
grep -q 'cachalloc CUDA memory summary, device ID 0' "$dir/err.txt" || fail "stderr: no table"
grep -q "^|    cuMemAlloc_v2  *$N |$" "$dir/err.txt" || fail "stderr: cuMemAlloc_v2 count"
grep -q "^| *of which in [1-9][0-9]* driver calls  *[0-9.]* ms |$" "$dir/err.txt" || { cat "$dir/err.txt"; fail "stderr: driver time row"; }

# unwritable path: one warning line, normal exit, output intact
run "stats:$dir/missing-dir/stats.json" exit || fail "unwritable: exited $?"
grep -qx done "$dir/out.txt" || fail "unwritable: program output lost"
[ "$(grep -c 'cachalloc: warning: cannot write the stats dump' "$dir/err.txt")" -eq 1 ] || fail "unwritable: expected one warning"
# issue 37: the reason is the true one (procfs answers ENOENT for a new
# name in a directory that exists), and it is given at start-up too
run "stats:/proc/cachalloc-x.json" exit || fail "/proc: exited $?"
grep -q "does not exist" "$dir/err.txt" && fail "/proc: says the directory does not exist"
grep -q "stats:/proc/cachalloc-x.json: a file cannot be created there now: directory /proc exists but does not allow creating files" \
  "$dir/err.txt" || fail "/proc: no start-up warning: $(cat "$dir/err.txt")"
grep -q "cannot write the stats dump to /proc/cachalloc-x.json: directory /proc exists" "$dir/err.txt" ||
  fail "/proc: exit warning: $(cat "$dir/err.txt")"

# trace: the allocations are on the timeline
run "trace:$dir/trace.json" exit || fail "trace: exited $?"
python3 - "$dir/trace.json" "$N" <<'PY' || fail "trace content"
import json, sys
t = json.load(open(sys.argv[1]))
n = int(sys.argv[2])
names = [e["name"] for e in t["traceEvents"] if e["ph"] == "i"]
assert names.count("alloc") == n, names
assert names.count("free") == (n + 1) // 2, names
assert any(e["ph"] == "C" and e["name"] == "reserved bytes (device 0)" for e in t["traceEvents"])
PY
# snapshot_signal: the snapshot is written on the signal, the program goes on
run "snapshot:$dir/snap-%p.json,snapshot_signal:USR2" usr2 || fail "usr2: exited $?"
f=$(ls "$dir"/snap-*.json 2>/dev/null)
[ -n "$f" ] || { cat "$dir/err.txt"; fail "usr2: no snapshot written on the signal"; }
python3 - "$f" "$N" <<'PY' || fail "snapshot content"
import json, sys
s = json.load(open(sys.argv[1]))
n = int(sys.argv[2])
blocks = [b for seg in s["devices"][0]["segments"] for b in seg["blocks"]]
live = sorted(b["requested_size"] for b in blocks if b["state"] == "active_allocated")
assert live == [(i + 1) * 1000 for i in range(1, n, 2)], live
PY
[ ! -e "$dir/stats-usr2.json" ] || fail "usr2: unexpected dump"

# out of memory: one readable message at error level, in log_file when given
run "" oom || fail "oom: exited $?"
grep -q '\[cachalloc [0-9]* error\] CUDA out of memory. Tried to allocate 1024.00 GiB' "$dir/err.txt" ||
  { cat "$dir/err.txt"; fail "oom: no OOM report on stderr"; }
run "log_file:$dir/log-%p.txt" oom || fail "oom/log_file: exited $?"
grep -q 'CUDA out of memory' "$dir/err.txt" && fail "oom/log_file: report went to stderr"
cat "$dir"/log-*.txt | grep -q 'error\] CUDA out of memory.*Device 0 has a total capacity of 1.00 GiB' ||
  fail "oom/log_file: no report in the log file"
# an unopenable log_file: one warning, the report still reaches stderr
run "log_file:$dir/missing-dir/log.txt" oom || fail "oom/bad log_file: exited $?"
[ "$(grep -c 'cachalloc: warning: cannot open log_file' "$dir/err.txt")" -eq 1 ] || fail "bad log_file: expected one warning"
grep -q "cannot open log_file $dir/missing-dir/log.txt: directory $dir/missing-dir does not exist; logging to stderr" \
  "$dir/err.txt" || fail "bad log_file: the warning does not say why: $(grep 'log_file' "$dir/err.txt")"
# a log_file that is a directory, and one in a directory nobody may write to
run "log_file:$dir" oom || fail "oom/directory log_file: exited $?"
grep -q "cannot open log_file $dir: it is a directory" "$dir/err.txt" || fail "directory log_file: $(grep 'log_file' "$dir/err.txt")"
if [ "$(id -u)" -ne 0 ]; then  # root writes anywhere
  mkdir "$dir/ro" && chmod 555 "$dir/ro"
  run "log_file:$dir/ro/log.txt" oom || fail "oom/read-only log_file: exited $?"
  grep -q "cannot open log_file $dir/ro/log.txt: no permission to create a file in directory $dir/ro" "$dir/err.txt" \
    || fail "read-only log_file: $(grep 'log_file' "$dir/err.txt")"
fi
grep -q 'error\] CUDA out of memory' "$dir/err.txt" || fail "bad log_file: report lost"

# issue 37: a bad key costs only itself.  The typo and a PyTorch-only key
# are reported at start-up, the good keys apply (the dump is written, the
# cache serves), and the dump and the table list them as config_errors.
run "stats:$dir/bad-conf.json,expandable_segment:true, backend:native,max_split_size_mb:3" exit ||
  fail "bad conf: exited $?"
grep -qx done "$dir/out.txt" || fail "bad conf: program output lost"
grep -q "unknown key 'expandable_segment' (did you mean 'expandable_segments'?)" "$dir/err.txt" ||
  { cat "$dir/err.txt"; fail "bad conf: the typo was not reported"; }
grep -q "backend: ignored (PyTorch-only)" "$dir/err.txt" || fail "bad conf: backend not reported as PyTorch-only"
grep -q "disabled" "$dir/err.txt" && fail "bad conf: cachalloc still disables itself"
[ -f "$dir/bad-conf.json" ] || { cat "$dir/err.txt"; fail "bad conf: the requested dump was not written"; }
check_dump "$dir/bad-conf.json"
python3 - "$dir/bad-conf.json" <<'PY' || fail "bad conf: config_errors"
import json, sys
d = json.load(open(sys.argv[1]))
e = d["config_errors"]
assert len(e) == 3, e
assert "expandable_segment'" in e[0] and "PyTorch-only" in e[1] and "max_split_size_mb: '3'" in e[2], e
assert "CACHALLOC_CONF items not applied (3):" in d["summary_table"], d["summary_table"]
assert d["interposer"]["calls"]["cuMemAlloc_v2"] > 0
PY
run "stats:$dir/good.json" exit || fail "good conf: exited $?"
python3 -c "import json,sys; assert json.load(open(sys.argv[1]))['config_errors'] == []" "$dir/good.json" ||
  fail "good conf: config_errors not an empty list"
# log_level:off does not hide them; log_file: takes them
run "log_level:off,bogus:1" exit || fail "bad conf/off: exited $?"
grep -q "unknown key 'bogus'" "$dir/err.txt" || fail "bad conf/off: not reported"
run "log_file:$dir/conf-log.txt,bogus:1" exit || fail "bad conf/log_file: exited $?"
grep -q "unknown key 'bogus'" "$dir/conf-log.txt" || fail "bad conf/log_file: not in the log"

# log_level:info: one line at start-up says cachalloc is active, its
# version, its route and the configuration it runs with
run "log_level:info,max_split_size_mb:64" exit || fail "info: exited $?"
[ "$(grep -c '\] cachalloc [0-9][^ ]* active: route preload' "$dir/err.txt")" -eq 1 ] ||
  { cat "$dir/err.txt"; fail "info: no start-up line"; }
grep '\] cachalloc [0-9][^ ]* active' "$dir/err.txt" | grep -q 'configuration: max_split_size_mb:64,' ||
  fail "info: the start-up line lacks the configuration"
run "" exit || fail "warn: exited $?"
grep -q 'active: route' "$dir/err.txt" && fail "warn: the start-up line is printed at the default level"

# log_file: the backtrace of a stream's first call goes to the log too, not
# to stderr (issue 37)
if [ -n "${ROUTE_LINKED:-}" ]; then
  env LD_PRELOAD="$shim" LD_LIBRARY_PATH="$fakedir" CACHALLOC_CONF="log_level:debug,log_file:$dir/bt-log.txt" \
    "$ROUTE_LINKED" ptsz_launch_beside_blocking > "$dir/out.txt" 2> "$dir/err.txt" || fail "backtrace: exited $?"
  grep -q "the stream's first call came from:" "$dir/bt-log.txt" || fail "backtrace: no header in the log"
  [ "$(grep -c 'libcachalloc' "$dir/bt-log.txt")" -ge 1 ] || fail "backtrace: no frames in the log"
  [ ! -s "$dir/err.txt" ] || fail "backtrace: stderr not empty: $(head -3 "$dir/err.txt")"
fi

# strict: exit status 1 before the program runs (at load, before main)
run "strict:true,bogus:1" nocuda
rc=$?
[ "$rc" -eq 1 ] || fail "strict: exit status $rc, expected 1"
[ ! -s "$dir/out.txt" ] || fail "strict: the program ran"
grep -q "unknown key 'bogus'" "$dir/err.txt" && grep -q "strict: exiting with status 1" "$dir/err.txt" ||
  fail "strict: message: $(cat "$dir/err.txt")"
(CACHALLOC_STRICT=1; export CACHALLOC_STRICT; run "backnd:native" nocuda)
[ $? -eq 1 ] || fail "CACHALLOC_STRICT=1: expected exit status 1"
run "strict:true,stats:$dir/strict-ok.json" exit || fail "strict, good conf: exited $?"
# strict runs a configuration copied from PyTorch's (its keys are ignored, named)
run "strict:true,backend:native,stats:$dir/strict-torch.json" exit || fail "strict, PyTorch-only key: exited $?"
[ -f "$dir/strict-torch.json" ] || fail "strict, PyTorch-only key: no dump"
[ -f "$dir/strict-ok.json" ] || fail "strict, good conf: no dump"
echo ok
