#!/bin/sh
# test_viz.sh — `cachalloc-report viz` on real reports: a program runs under
# the preloaded shim over the fake libcuda.so.1 with snapshot, trace and
# stats dumps on, its snapshot is converted to torch.cuda.memory._snapshot()'s
# pickle, and check_memory_viz.py checks the pickle against what
# MemoryViz.js (pytorch.org/memory_viz) and torch.cuda._memory_viz rely on and
# against the reports it came from (with PyTorch importable, it also runs
# _memory_viz's trace_plot/segment_plot on it).  Without PyTorch everything
# else still runs, and the test then exits 77 (meson: SKIP), not 0: a pass
# would claim that PyTorch's own viewer code read the pickles.
#   test_viz.sh prog REPORT CHECKER TEST_VIZ_PROG LIBCACHALLOC FAKE_LIBCUDA_DIR
#       two devices, classic and expandable segments, a pending free, an
#       out-of-memory, empty_cache; a trace ring that dropped events;
#       --no-trace; a trace that does not match the snapshot; a file that is
#       not a snapshot
#   test_viz.sh example REPORT CHECKER DRIVER_PATTERNS LIBCACHALLOC FAKE_LIBCUDA_DIR
#       examples/driver_patterns.c, classic and expandable segments, and a
#       trace ring that dropped events
set -u
mode=$1
report=$2
checker=$3
prog=$4
shim=$5
fakedir=$6
command -v python3 >/dev/null 2>&1 || exit 77
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
torch_skipped=0

# check WHAT CHECKER-ARGS...: check_memory_viz.py; its 77 (all passed, the
# PyTorch part could not run) is remembered for the exit status
check() {
  what=$1
  shift
  python3 "$checker" "$@"
  rc=$?
  case $rc in
  0) ;;
  77) torch_skipped=1 ;;
  *) fail "$what: check_memory_viz.py" ;;
  esac
}

# run NAME CONF ARGS...: the program under the shim, reports into $dir/NAME/
run() {
  name=$1 conf=$2
  shift 2
  mkdir -p "$dir/$name"
  env LD_PRELOAD="$shim" LD_LIBRARY_PATH="$fakedir" FAKE_CUDA_TOTAL_MB=1024 FAKE_CUDA_DEVICES=2 \
    CACHALLOC_CONF="snapshot:$dir/$name/snap-%p.json,trace:$dir/$name/trace-%p.json,stats:$dir/$name/stats-%p.json${conf:+,$conf}" \
    "$prog" "$@" > "$dir/$name/out.txt" 2> "$dir/$name/err.txt"
  rc=$?
  [ "$rc" -eq 0 ] || { cat "$dir/$name/err.txt"; fail "$name: the program exited $rc"; }
  snap=$(ls "$dir/$name"/snap-*.json 2>/dev/null)
  trace=$(ls "$dir/$name"/trace-*.json 2>/dev/null)
  [ -n "$snap" ] && [ -n "$trace" ] || { cat "$dir/$name/err.txt"; fail "$name: no snapshot or trace written"; }
}

# viz NAME CHECKER-ARGS...: converts (the trace and stats dump found next to
# the snapshot), then checks
viz() {
  name=$1
  shift
  python3 "$report" viz "$snap" -o "$dir/$name/snap.pickle" > "$dir/$name/viz.txt" 2> "$dir/$name/viz-err.txt" ||
    { cat "$dir/$name/viz-err.txt"; fail "$name: viz exited $?"; }
  grep -q "^using the trace $trace " "$dir/$name/viz-err.txt" || { cat "$dir/$name/viz-err.txt"; fail "$name: the trace next to the snapshot was not used"; }
  grep -q 'does not end where the snapshot was taken' "$dir/$name/viz-err.txt" &&
    { cat "$dir/$name/viz-err.txt"; fail "$name: trace and snapshot of one exit judged unaligned"; }
  grep -q "^wrote $dir/$name/snap.pickle: " "$dir/$name/viz.txt" || fail "$name: no summary line"
  echo "== $name"
  check "$name" "$dir/$name/snap.pickle" "$snap" "$trace" "$@"
}

case $mode in
prog)
  run classic "" 2
  viz classic --expect devices=2 --expect classic --expect pending --expect oom
  classic_snap=$snap
  grep -q 'empty_cache) left out' "$dir/classic/viz-err.txt" || fail "classic: empty_cache events not reported as left out"
  python3 - "$dir/classic/snap.pickle" <<'PY' || fail "classic: allocator_settings from the stats dump"
import pickle, sys
s = pickle.load(open(sys.argv[1], "rb"))["allocator_settings"]
assert "free_sync:" in s["PYTORCH_CUDA_ALLOC_CONF"], s
assert s["expandable_segments"] is False and s["max_split_size"] == -1, s
assert s["trace_alloc_overflowed"] is False and s["trace_alloc_max_entries"] == 1048576, s
assert len(s["roundup_power2_divisions"]) >= 1, s
PY

  run expandable "expandable_segments:true" 2
  viz expandable --expect devices=2 --expect expandable --expect pending --expect oom

  # a ring that dropped its oldest events
  run truncated "trace_max_entries:20" 2
  viz truncated --expect classic
  grep -q 'the trace had dropped its [0-9]* oldest events' "$dir/truncated/viz-err.txt" || fail "truncated: no note"

  # a dangling link among the dumps (its target is gone) is passed over
  ln -s "$dir/gone.json" "$dir/classic/link.json"
  python3 "$report" viz "$classic_snap" -o "$dir/link.pickle" > /dev/null 2> "$dir/link-err.txt" ||
    { cat "$dir/link-err.txt"; fail "dangling link.json: viz exited $?"; }
  rm -f "$dir/classic/link.json"

  # segments only
  python3 "$report" viz "$classic_snap" --no-trace -o "$dir/notrace.pickle" > /dev/null 2>&1 || fail "--no-trace exited $?"
  echo "== no trace"
  check --no-trace "$dir/notrace.pickle" "$classic_snap"

  # a trace from another run: left out with a note, the pickle still opens
  python3 "$report" viz "$classic_snap" --trace "$trace" -o "$dir/mixed.pickle" > /dev/null 2> "$dir/mixed-err.txt" ||
    fail "mismatched trace: viz exited $?"
  grep -q 'does not end where the snapshot was taken' "$dir/mixed-err.txt" || { cat "$dir/mixed-err.txt"; fail "mismatched trace: no note"; }
  echo "== mismatched trace"
  check "mismatched trace" "$dir/mixed.pickle" "$classic_snap"

  # not a snapshot
  python3 "$report" viz "$trace" -o "$dir/bad.pickle" > /dev/null 2> "$dir/bad-err.txt" && fail "viz accepted a trace as snapshot"
  grep -q 'is not a cachalloc snapshot' "$dir/bad-err.txt" || fail "not a snapshot: unclear message: $(cat "$dir/bad-err.txt")"
  [ ! -e "$dir/bad.pickle" ] || fail "not a snapshot: a pickle was written"
  ;;
example)
  run example ""
  grep -q 'driver_patterns: PASS' "$dir/example/out.txt" || fail "example: driver_patterns did not pass"
  viz example --expect classic
  run example_expandable "expandable_segments:true"
  grep -q 'driver_patterns: PASS' "$dir/example_expandable/out.txt" || fail "example_expandable: driver_patterns did not pass"
  viz example_expandable --expect expandable
  # a ring that dropped its oldest events (and pending blocks of destroyed
  # streams whose history went with them)
  run example_truncated "trace_max_entries:200"
  viz example_truncated --expect classic
  grep -q 'the trace had dropped its [0-9]* oldest events' "$dir/example_truncated/viz-err.txt" ||
    fail "example_truncated: no note"
  ;;
*) fail "unknown mode $mode" ;;
esac
if [ "$torch_skipped" -eq 1 ]; then
  echo "SKIP: everything else passed, but PyTorch is not importable: torch.cuda._memory_viz did not read the pickles"
  exit 77
fi
echo ok
