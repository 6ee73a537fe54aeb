#!/usr/bin/env bash
# gpu-check.sh — the whole GPU check in one command, for a lent GPU machine
# (docs/GPU-CHECK.md).  From the repository root:
#
#   scripts/gpu-check.sh
#
# Steps, each under its own timeout and independent of the others (a failed
# step still lets the rest run and report):
#   1. machine: nvidia-smi -L, driver, nvcc, compilers, Python packages
#   2. configure + build (meson setup build-gpu -Ddeps_include=.deps/usr/include -Dbench=true; ninja)
#   3. meson test: suites unit, integration, gpu (examples with and without the shim)
#   4. the examples again under the launcher with stats:stderr (tail of the table shown),
#      fidelity_patterns included, multi_stream with its peak and time shim/bare; 4b. fidelity_patterns under expandable
#      segments, and its peer pattern (SKIP with one GPU)
#   5. real clients (PyTorch, CuPy, CuPy IPC, JAX, numba) with and without the shim
#   5b. pause/resume: examples/pause_resume.cu (host and disk backups), tests/gpu/clients/pause_rl_loop.py (<= 130 s)
#       and, with two GPUs, tests/gpu/clients/pause_nccl.py (NCCL on a tagged buffer after resume, <= 150 s)
#   5c. torch_memory_saver's own suite, where a copy sits in an ignored directory (tests/gpu/run_tms_suite.sh)
#   6. allocation latency benchmarks, static and shared cudart, with and without the shim
#   7. other configurations, observability dumps, core benchmark
#   8. numba-cuda's own test suites, bare vs shim (only with GPU_CHECK_NUMBA, ~10 min)
#   9. reliability: compute-sanitizer bare vs shim, a PyTorch soak (only with GPU_CHECK_RELIABILITY)
# and prints LAST a table: one row per check (name, PASS/FAIL/SKIP, key figure).
#
# Without a GPU it still configures, builds and runs what it can; GPU steps
# report SKIP.  Artefacts go to $OUT when set (else ./gpu-check-out): at most
# four files — gpu-check.log, summary.txt, bench.txt, artefacts.tar.gz.
#
# Environment: BUILD_DIR (default build-gpu), GPU_CHECK_BUDGET (seconds for
# the whole run, default 540), JOBS (default nproc), GPU_CHECK_NUMBA (unset:
# step 8 is skipped; 1: step 8 runs last, within what is left of the budget;
# only: steps 1, 2 and 8 alone, for a call of its own), GPU_CHECK_RELIABILITY
# (unset: skipped; 1: step 9 at the end; only: steps 1, 2 and 9 alone) with
# GPU_CHECK_SOAK_SECONDS (default 180), GPU_CHECK_SKIP (steps among 4b, 5b, 6
# and 7 to leave out, e.g. "4b 6": for a call short of time), GPU_CHECK_NUMBA_SUITE
# (cudadrv, cudapy or both; default both), GPU_CHECK_NUMBA_CONCURRENT=1 (bare
# and shim runs of a suite at the same time).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
source scripts/gpu-build.sh
START=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET:-540}
BUILD=${BUILD_DIR:-build-gpu}
JOBS=${JOBS:-$(nproc)}
OUTDIR=${OUT:-$ROOT/gpu-check-out}
NUMBA_MODE=${GPU_CHECK_NUMBA:-0}
RELIABILITY_MODE=${GPU_CHECK_RELIABILITY:-0}
SOAK_SECONDS=${GPU_CHECK_SOAK_SECONDS:-180}
NUMBA_SUITE=${GPU_CHECK_NUMBA_SUITE:-both}
SKIP_STEPS=" ${GPU_CHECK_SKIP:-} "   # e.g. "4b 6": steps left out (their rows say SKIP)
mkdir -p "$OUTDIR"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
ROWS="$WORK/rows.tsv"
: >"$ROWS"
exec > >(tee "$OUTDIR/gpu-check.log") 2>&1

# --- helpers ---------------------------------------------------------------
elapsed() { echo $(( $(date +%s) - START )); }
# A step's timeout: what it wants, cut to what is left of the budget (keeping
# 15 s to bundle and print the table).
budget_for() {
  local want=$1 left=$(( BUDGET - $(elapsed) - 15 ))
  (( left < want )) && want=$left
  (( want < 5 )) && want=5
  echo "$want"
}
row() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$ROWS"; }
banner() { printf '\n===== %s  (t=%ss)\n' "$1" "$(elapsed)"; }
# Runs a command under a timeout, output to the terminal and to a log file.
# Usage: timed LOGNAME SECONDS cmd...; returns the command's status.
timed() {
  local log="$WORK/$1.log" secs=$2
  shift 2
  timeout --kill-after=10 "$secs" "$@" 2>&1 | tee "$log"
  return "${PIPESTATUS[0]}"
}
# Whether step $1 was left out with GPU_CHECK_SKIP (a device call short of time).
left_out() { [[ $SKIP_STEPS == *" $1 "* ]]; }
# Whether step $1, which needs the GPU and the shim, can run; if not, writes
# its row $2 (SKIP: left out, no GPU; FAIL: libcachalloc.so not built).
runs_with_shim() {
  if left_out "$1"; then
    row "$2" SKIP "left out (GPU_CHECK_SKIP)"
  elif (( ! HAVE_GPU )); then
    row "$2" SKIP "no GPU"
  elif [[ -z "$SHIM" ]]; then
    row "$2" FAIL "libcachalloc.so not built"
  else
    return 0
  fi
  return 1
}
status_of() { case "$1" in 0) echo PASS ;; 77) echo SKIP ;; 124|137) echo "FAIL" ;; *) echo FAIL ;; esac; }
timeout_note() { case "$1" in 124|137) echo " (timed out)" ;; *) echo "" ;; esac; }

# --- 1. the machine ----------------------------------------------------------
banner "1. machine"
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
HAVE_GPU=0
if command -v nvidia-smi >/dev/null 2>&1 && timeout 30 nvidia-smi -L; then
  HAVE_GPU=1
  timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
fi
gpu_name=$( (timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || true) | head -1)
if (( HAVE_GPU )); then row "gpu" PASS "${gpu_name:-present}"; else
  echo "no GPU here (nvidia-smi absent or failing): GPU steps will report SKIP"
  row "gpu" SKIP "no GPU: GPU steps skipped"
fi
for tool in nvcc gcc g++ meson ninja python3; do
  printf '%-8s %s\n' "$tool" "$( (command -v "$tool" >/dev/null && "$tool" --version 2>&1 | grep -m1 -iE 'release|[0-9]+\.[0-9]+') || echo 'not found')"
done
timeout 30 python3 - <<'PY' || true
import importlib.metadata as md
for pkg in ["torch", "cupy-cuda13x", "cupy", "jax", "jaxlib", "jax-cuda13-plugin", "numba", "numba-cuda", "numpy"]:
    try:
        print(f"python   {pkg} {md.version(pkg)}")
    except md.PackageNotFoundError:
        pass
PY

# --- 2. configure and build --------------------------------------------------
banner "2. configure and build ($BUILD, -j$JOBS)"
gpu_setup_args
t0=$(date +%s)
if [[ -f "$BUILD/meson-private/coredata.dat" ]]; then
  # An existing build dir is reconfigured (keeps its objects); wiped only if that fails.
  timed configure "$(budget_for 90)" meson setup --reconfigure "$BUILD" "${setup_args[@]}" ||
    timed configure "$(budget_for 90)" meson setup --wipe "$BUILD" "${setup_args[@]}"
else
  timed configure "$(budget_for 90)" meson setup "$BUILD" "${setup_args[@]}"
fi
rc=$?
row "configure" "$(status_of $rc)" "meson setup ${setup_args[*]}$(timeout_note $rc)"
if [[ -f "$BUILD/build.ninja" ]]; then
  timed build "$(budget_for 300)" ninja -C "$BUILD" -k 0 -j "$JOBS"
  rc=$?
  row "build" "$(status_of $rc)" "$(( $(date +%s) - t0 )) s, $(grep -c 'FAILED:' "$WORK/build.log") targets failed$(timeout_note $rc)"
else
  row "build" FAIL "not configured"
fi
SHIM=$(find "$BUILD" -name 'libcachalloc.so' \( -type f -o -type l \) 2>/dev/null | head -1)
LAUNCHER=$(find "$BUILD" -name cachalloc -type f -perm -u+x 2>/dev/null | head -1)
echo "shim:     ${SHIM:-not built}"
echo "launcher: ${LAUNCHER:-not built (LD_PRELOAD is used directly)}"

# --- 8. numba-cuda's own test suites (a function: GPU_CHECK_NUMBA=only runs it
# right after the build) --------------------------------------------------------
numba_suites_step() {
  banner "8. numba-cuda's test suites ($NUMBA_SUITE), bare and under the shim"
  if (( ! HAVE_GPU )); then row "numba suites" SKIP "no GPU"; return; fi
  if [[ -z "$SHIM" ]]; then row "numba suites" FAIL "libcachalloc.so not built"; return; fi
  local total extra=() rc
  total=$(budget_for 1500)
  [[ ${GPU_CHECK_NUMBA_CONCURRENT:-0} == 1 ]] && extra+=(--concurrent)
  # The script splits its --budget among its runs and writes its rows before
  # the outer timeout could cut it.
  timed numba-suites "$total" python3 tests/gpu/run_numba_suites.py --shim "$SHIM" \
    --suite "$NUMBA_SUITE" --out "$WORK/numba-suites" --rows "$WORK/numba-rows.tsv" \
    --budget "$(( total > 40 ? total - 20 : 20 ))" "${extra[@]}"
  rc=$?
  if [[ -s "$WORK/numba-rows.tsv" ]]; then cat "$WORK/numba-rows.tsv" >>"$ROWS"
  else row "numba suites" FAIL "no result rows (exit $rc$(timeout_note $rc))"; fi
}

# --- results (a function: GPU_CHECK_NUMBA=only ends here early) ---------------------
finish() {
  tar -czf "$OUTDIR/artefacts.tar.gz" -C "$WORK" . 2>/dev/null
  {
    printf '\n===== gpu-check summary (%s, %s s)\n' "${gpu_name:-no GPU}" "$(elapsed)"
    awk -F'\t' '{ printf "%-48s %-5s %s\n", $1, $2, $3 }' "$ROWS"
    printf '%s checks: %s PASS, %s FAIL, %s SKIP\n' "$(wc -l <"$ROWS")" \
      "$(grep -c $'\tPASS\t' "$ROWS")" "$(grep -c $'\tFAIL\t' "$ROWS")" "$(grep -c $'\tSKIP\t' "$ROWS")"
  } | tee "$OUTDIR/summary.txt"
  local final=0
  grep -q $'\tFAIL\t' "$ROWS" && final=1
  rm -rf "$WORK"
  exit $final
}

# --- 9. reliability (issue 10): compute-sanitizer over the examples bare and
# under the shim, and a PyTorch soak (a function: GPU_CHECK_RELIABILITY=only
# runs it right after the build; =1 at the end) --------------------------------
reliability_step() {
  banner "9. reliability: compute-sanitizer, soak (${SOAK_SECONDS} s under the shim, then bare)"
  if (( ! HAVE_GPU )); then row "reliability" SKIP "no GPU"; return; fi
  if [[ -z "$SHIM" ]]; then row "reliability" FAIL "libcachalloc.so not built"; return; fi
  timed sanitizer "$(budget_for 400)" tests/gpu/run_sanitizer.sh "$SHIM" "$BUILD" "$WORK/sanitizer" "$ROWS"
  timed soak "$(budget_for $(( 2 * SOAK_SECONDS + 120 )))" python3 tests/gpu/run_soak.py --shim "$SHIM" \
    --seconds "$SOAK_SECONDS" --out "$WORK/soak" --rows "$ROWS"
  [[ -f "$WORK/soak/soak-shim.json" ]] && cp "$WORK/soak/soak-shim.json" "$WORK/soak/soak-bare.json" "$OUTDIR/" 2>/dev/null
}

if [[ $RELIABILITY_MODE == only ]]; then
  echo "GPU_CHECK_RELIABILITY=only: steps 3-8 are left out"
  reliability_step
  finish
fi

if [[ $NUMBA_MODE == only ]]; then
  echo "GPU_CHECK_NUMBA=only: steps 3-7 are left out"
  numba_suites_step
  finish
fi

# --- 3. meson test -------------------------------------------------------------
banner "3. meson test: unit, integration, gpu"
# meson test refuses to start when any selected program is missing, so when
# part of the build failed the tests that were built run one by one.
suites=(--suite unit --suite integration --suite gpu --no-suite gpu_clients)
testlog="$WORK/testlog.json"
: >"$testlog"
: >"$WORK/tests-not-built.txt"
if [[ -f "$BUILD/build.ninja" ]]; then
  rm -f "$BUILD/meson-logs/testlog.json"
  timed tests "$(budget_for 240)" meson test -C "$BUILD" --no-rebuild --print-errorlogs \
    "${suites[@]}" --num-processes "$JOBS"
  rc=$?
  if grep -q "Cannot run tests before building them" "$WORK/tests.log"; then
    echo "some test programs were not built: running the others one at a time"
    meson test -C "$BUILD" --no-rebuild --list "${suites[@]}" 2>/dev/null | grep -E ' / | - ' >"$WORK/test-names.txt"
    rm -f "$BUILD"/meson-logs/one-*
    i=0
    while read -r line; do
      i=$((i + 1))
      # "project:suite / test" (meson 1.0) or "suite - project:test" (newer)
      if [[ $line == *" / "* ]]; then name=${line##* / }; else name=${line##*:}; fi
      timeout --kill-after=5 "$(budget_for 200)" meson test -C "$BUILD" --no-rebuild --print-errorlogs \
        --logbase "one-$i" "$name" >>"$WORK/tests.log" 2>&1 </dev/null
      if [[ -f "$BUILD/meson-logs/one-$i.json" ]]; then cat "$BUILD/meson-logs/one-$i.json" >>"$testlog"
      else echo "$line" >>"$WORK/tests-not-built.txt"; fi
    done <"$WORK/test-names.txt"
  elif [[ -f "$BUILD/meson-logs/testlog.json" ]]; then
    cp "$BUILD/meson-logs/testlog.json" "$testlog"
  fi
  grep -E '^ *[0-9]+/[0-9]+ ' "$WORK/tests.log" | grep -vE ' (OK|SKIP) ' | head -20
  # One row per suite, counted from meson's JSON logs.
  python3 - "$testlog" "$WORK/tests-not-built.txt" "$rc" >>"$ROWS" <<'PY'
import json, sys, collections
SUITES = ("unit", "integration", "gpu")
counts = {s: collections.Counter() for s in SUITES}
failed = {s: [] for s in SUITES}
def suite_and_test(name):
    """Meson 1.0 names tests "project:suite / test", newer ones "suite - project:test"."""
    if " / " in name:
        head, test = name.split(" / ", 1)
        return head.split(":")[-1].strip(), test.strip()
    if " - " in name:
        head, test = name.split(" - ", 1)
        return head.strip(), test.split(":")[-1].strip()
    return None, name
for line in open(sys.argv[1]):
    if line.strip():
        t = json.loads(line)
        s, _ = suite_and_test(t["name"])
        if s in SUITES:
            counts[s][t["result"]] += 1
            if t["result"] not in ("OK", "SKIP", "EXPECTEDFAIL"):
                failed[s].append(suite_and_test(t["name"])[1])
for line in open(sys.argv[2]):  # tests whose programs were never built
    s, test = suite_and_test(line.strip())
    if s in SUITES:
        counts[s]["NOTBUILT"] += 1
        failed[s].append(test + " (not built)")
for s in SUITES:
    c = counts[s]
    bad = sum(v for k, v in c.items() if k not in ("OK", "SKIP", "EXPECTEDFAIL"))
    if not c:
        print(f"suite {s}\tFAIL\tno results (meson test exit {sys.argv[3]})")
        continue
    status = "FAIL" if bad else ("SKIP" if c["OK"] == 0 else "PASS")
    fig = f"{c['OK']} ok, {bad} failed, {c['SKIP']} skipped"
    if failed[s]:
        fig += ": " + ", ".join(failed[s][:4]) + (" ..." if len(failed[s]) > 4 else "")
    print(f"suite {s}\t{status}\t{fig}")
PY
else
  row "meson test" FAIL "not configured"
fi

# --- 4. examples under the launcher, stats:stderr ---------------------------
banner "4. examples with and without the shim (stats:stderr)"
# The examples run under the launcher when the shim work built one, else
# with LD_PRELOAD directly; either way the exit table goes to stderr.
if [[ -n "$LAUNCHER" ]]; then shim_cmd=("$LAUNCHER" --conf stats:stderr --)
else shim_cmd=(env LD_PRELOAD="$SHIM" CACHALLOC_CONF=stats:stderr); fi
for ex in alloc_patterns_static alloc_patterns_shared driver_patterns \
          fidelity_patterns_static fidelity_patterns_shared \
          per_thread_streams_static per_thread_streams_shared per_thread_streams_explicit \
          multi_stream_static multi_stream_shared; do
  prog="$BUILD/examples/$ex"
  # multi_stream: a thread per stream (static cudart), one thread driving all
  # streams (shared cudart); each about 10-20 s bare.
  args=()
  [[ $ex == multi_stream_shared ]] && args=(--mode round-robin)
  if (( ! HAVE_GPU )); then row "example $ex" SKIP "no GPU"; continue; fi
  if [[ ! -x "$prog" ]]; then row "example $ex" FAIL "not built"; continue; fi
  if [[ -z "$SHIM" ]]; then row "example $ex" FAIL "libcachalloc.so not built"; continue; fi
  echo "--- $ex without the shim"
  t0=$(date +%s%N)
  timed "$ex-noshim" "$(budget_for 90)" env -u LD_PRELOAD "$prog" "${args[@]}"
  rc_bare=$?
  ms_bare=$(( ($(date +%s%N) - t0) / 1000000 ))
  echo "--- $ex under the shim"
  t0=$(date +%s%N)
  timeout --kill-after=10 "$(budget_for 90)" "${shim_cmd[@]}" "$prog" "${args[@]}" \
    >"$WORK/$ex-shim.out" 2>"$WORK/$ex-shim.err"
  rc=$?
  ms_shim=$(( ($(date +%s%N) - t0) / 1000000 ))
  cat "$WORK/$ex-shim.out"
  echo "--- stats table (tail of stderr)"
  tail -n 30 "$WORK/$ex-shim.err"
  fig="shim ${ms_shim} ms, bare ${ms_bare} ms"
  # One figure per fence pattern (fence, fence_blocking), joined by '/'.
  free_shim=$(grep -o 'mean cudaFree [0-9.]* ms' "$WORK/$ex-shim.out" | grep -o '[0-9.]*' | paste -sd/)
  free_bare=$(grep -o 'mean cudaFree [0-9.]* ms' "$WORK/$ex-noshim.log" | grep -o '[0-9.]*' | paste -sd/)
  [[ -n "$free_shim" ]] && fig+="; cudaFree during a busy kernel (fence/fence_blocking): ${free_shim} ms (bare ${free_bare:-?} ms)"
  # fidelity_patterns: the patterns that did not pass (peer is a SKIP on one GPU).
  if [[ $ex == fidelity_patterns_* ]]; then
    notpass=$(grep -E '^[a-z_]+: (FAIL|SKIP)' "$WORK/$ex-shim.out" | grep -v '^fidelity_patterns:' |
              cut -d' ' -f1-2 | tr -d ':' | paste -sd, -)
    fig+="; patterns not passing under the shim: ${notpass:-none}"
  fi
  # multi_stream: the device's peak and the wall time under the shim against
  # bare, from each run's RESULT line (issue 18: memory parity).
  if [[ $ex == multi_stream_* ]]; then
    fig+="; $(python3 - "$WORK/$ex-shim.out" "$WORK/$ex-noshim.log" <<'PY'
import json, sys
def result(path):
    try:
        lines = [l for l in open(path, errors="replace") if l.startswith("RESULT ")]
        return json.loads(lines[-1][len("RESULT "):]) if lines else None
    except (OSError, ValueError):
        return None
shim, bare = result(sys.argv[1]), result(sys.argv[2])
if not shim or not bare:
    print(f"RESULT line missing ({'shim' if not shim else 'bare'})")
    sys.exit()
mib = lambda b: b / 2**20
ratio = lambda a, b: f"{a / b:.2f}x" if b else "n/a"
print(f"peak ({shim['peak_source']}) shim {mib(shim['peak_bytes']):.0f} MiB / bare {mib(bare['peak_bytes']):.0f} MiB"
      f" = {ratio(shim['peak_bytes'], bare['peak_bytes'])}, time shim {shim['seconds']:.2f} s / bare"
      f" {bare['seconds']:.2f} s = {ratio(shim['seconds'], bare['seconds'])}, {shim['allocs']} allocations,"
      f" mismatching words shim {shim['mismatches']} bare {bare['mismatches']}")
PY
)"
  fi
  # When alloc_patterns or fidelity_patterns fails under the shim, each
  # pattern runs alone so the row can name every failing one (a crash would
  # hide those after it).
  case $ex in
    alloc_patterns_*) patterns="sizes fence async graph threads meminfo fence_blocking oom" ;;
    fidelity_patterns_*) patterns="range_memset attributes_freed ipc_shim_importer ipc_bare_importer expandable_ipc reset peer" ;;
    *) patterns="" ;;
  esac
  if [[ -n $patterns && $rc -ne 0 && $rc -ne 77 ]]; then
    failing=""
    for pat in $patterns; do
      timeout --kill-after=5 "$(budget_for 60)" env LD_PRELOAD="$SHIM" "$prog" "$pat" >"$WORK/$ex-$pat.log" 2>&1
      prc=$?
      [[ $prc -ne 0 ]] && failing+=" $pat(exit $prc)"
    done
    echo "patterns failing alone under the shim:${failing:- none}"
    fig+="; failing alone:${failing:- none}"
  fi
  if [[ $rc -eq 77 && $rc_bare -eq 77 ]]; then
    row "example $ex" SKIP "the program found no usable GPU"
  elif [[ $rc -eq 0 && $rc_bare -eq 0 ]] && grep -qE ': PASS$' "$WORK/$ex-shim.out"; then
    row "example $ex" PASS "$fig"
  else
    row "example $ex" FAIL "exit shim=$rc bare=$rc_bare$(timeout_note $rc); $fig"
  fi
done

# --- 4b. fidelity_patterns under expandable segments; peer access -------------------
banner "4b. fidelity_patterns: expandable segments, peer access"
# Default-configuration runs are rows of step 4 (and of the gpu suite).
if runs_with_shim 4b "fidelity configs"; then
  for variant in static shared; do
    prog="$BUILD/examples/fidelity_patterns_$variant"
    name="fidelity_patterns_$variant expandable_segments:true"
    if [[ ! -x "$prog" ]]; then row "$name" FAIL "not built"; continue; fi
    log="$WORK/fidelity-$variant-expandable.log"
    timeout --kill-after=10 "$(budget_for 120)" env LD_PRELOAD="$SHIM" CACHALLOC_CONF=expandable_segments:true \
      "$prog" range_memset attributes_freed ipc reset expandable_ipc >"$log" 2>&1
    rc=$?
    cat "$log"
    failing=$(grep -E '^[a-z_]+: FAIL' "$log" | grep -v '^fidelity_patterns:' | cut -d: -f1 | paste -sd, -)
    skipped=$(grep -E '^[a-z_]+: SKIP' "$log" | cut -d: -f1 | paste -sd, -)
    exported=$(grep -m1 -o '[0-9] of 3 buffers exported.*' "$log")
    if [[ $rc -eq 0 ]] && grep -q '^fidelity_patterns: PASS$' "$log"; then
      row "$name" PASS "range_memset attributes_freed ipc reset expandable_ipc: none failed${skipped:+, skipped: $skipped (export refused)}; expandable_ipc: ${exported:-?}"
    else
      row "$name" FAIL "exit $rc$(timeout_note $rc); failing: ${failing:-?}; expandable_ipc: ${exported:-?}"
    fi
  done
  # The peer pattern bare, under the shim, and under the shim with expandable
  # segments (whose pages mapped after enabling need access granted).
  prog="$BUILD/examples/fidelity_patterns_static"
  if [[ ! -x "$prog" ]]; then
    row "fidelity peer" FAIL "not built"
  else
    peer_fig="" peer_fail=0 peer_pass=0
    for mode in bare shim expandable_segments:true; do
      log="$WORK/fidelity-peer-${mode%%:*}.log"
      case $mode in
        bare) timeout --kill-after=10 "$(budget_for 90)" env -u LD_PRELOAD -u CACHALLOC_CONF "$prog" peer >"$log" 2>&1 ;;
        shim) timeout --kill-after=10 "$(budget_for 90)" env LD_PRELOAD="$SHIM" "$prog" peer >"$log" 2>&1 ;;
        *) timeout --kill-after=10 "$(budget_for 90)" env LD_PRELOAD="$SHIM" CACHALLOC_CONF="$mode" "$prog" peer >"$log" 2>&1 ;;
      esac
      rc=$?
      cat "$log"
      line=$(grep -m1 -E '^peer: ' "$log")
      case "$rc:$line" in
        0:"peer: PASS") peer_pass=$((peer_pass + 1)); peer_fig+=" $mode PASS;" ;;
        0:"peer: SKIP"*) peer_fig+=" $mode ${line#peer: };" ;;
        77:*) peer_fig+=" $mode SKIP (no GPU);" ;;
        *) peer_fail=1; peer_fig+=" $mode FAIL (exit $rc$(timeout_note $rc): ${line#peer: });" ;;
      esac
    done
    if (( peer_fail )); then row "fidelity peer" FAIL "${peer_fig%;}"
    elif (( peer_pass )); then row "fidelity peer" PASS "${peer_fig%;}"
    else row "fidelity peer" SKIP "${peer_fig%;}"; fi
  fi
fi

# --- 5. real clients -----------------------------------------------------------
banner "5. real clients with and without the shim"
if (( ! HAVE_GPU )); then
  row "clients" SKIP "no GPU"
elif [[ -z "$SHIM" ]]; then
  row "clients" FAIL "libcachalloc.so not built"
else
  timed clients "$(budget_for 300)" python3 tests/gpu/clients/run_clients.py \
    --shim "$SHIM" --out "$WORK/clients" --rows "$WORK/client-rows.tsv"
  rc=$?
  if [[ -s "$WORK/client-rows.tsv" ]]; then cat "$WORK/client-rows.tsv" >>"$ROWS"
  else row "clients" FAIL "no result rows (exit $rc$(timeout_note $rc))"; fi
  # torch.cuda.memory_stats() and the rest under use_with_torch() and under
  # LD_PRELOAD + patch_torch(), against PyTorch's own allocator and the dumps
  mkdir -p "$WORK/clients"
  timed torch_memory "$(budget_for 180)" python3 tests/gpu/clients/torch_memory_functions.py \
    --shim "$SHIM" --module-dir "$BUILD/python" --out "$WORK/clients"
  rc=$?
  row "torch memory functions" "$(status_of $rc)" "$(grep -E 'FAIL|SKIP|^pluggable:' "$WORK/torch_memory.log" | head -1)$(timeout_note $rc)"
  # CUDA graphs (global capture mode) and torch.OutOfMemoryError under
  # use_with_torch(): the graph-pool hooks and the OOM companion (issue 35)
  timed torch_graphs "$(budget_for 120)" python3 tests/gpu/clients/torch_pluggable_graphs.py \
    --shim "$SHIM" --module-dir "$BUILD/python"
  rc=$?
  row "torch pluggable graphs" "$(status_of $rc)" "$(grep -E 'FAIL|SKIP|^release:' "$WORK/torch_graphs.log" | head -1)$(timeout_note $rc)"
fi

# --- 5b. pause and resume (docs/PAUSE.md) ----------------------------------------
# The plain CUDA example (runtime API, control API via dlsym) and the PyTorch
# RL-style loop (20 alternations, bit-identical to a never-paused run, NVML
# after pause, ms/GiB against the driver's cuMemMap/cuMemUnmap floor).
banner "5b. pause and resume"
if runs_with_shim 5b "pause/resume"; then
  prog="$BUILD/examples/pause_resume_static"
  if [[ -x "$prog" ]]; then
    timeout --kill-after=5 "$(budget_for 20)" env LD_PRELOAD="$SHIM" "$prog" 1024 1024 5 >"$WORK/pause-example.log" 2>&1
    rc=$?
    cat "$WORK/pause-example.log"
    row "pause/resume example" "$(status_of $rc)" "$(grep -E '^(PASS|FAIL|SKIP)' "$WORK/pause-example.log" | head -1 | cut -c1-200)$(timeout_note $rc)"
    # The same with the weights backed up to a file (disk backup, issue 20)
    # in a directory of the check's own, which must be empty afterwards.
    mkdir -p "$WORK/pause-backups"
    timeout --kill-after=5 "$(budget_for 40)" env LD_PRELOAD="$SHIM" CACHALLOC_CONF="pause_backup_dir:$WORK/pause-backups" \
      "$prog" 1024 1024 3 disk >"$WORK/pause-example-disk.log" 2>&1
    rc=$?
    cat "$WORK/pause-example-disk.log"
    left=$(find "$WORK/pause-backups" -mindepth 1 | wc -l)
    (( rc == 0 && left != 0 )) && rc=1
    row "pause/resume example, disk backup" "$(status_of $rc)" "$(grep -E '^(PASS|FAIL|SKIP)' "$WORK/pause-example-disk.log" | head -1 | cut -c1-200); files left: $left$(timeout_note $rc)"
  else
    row "pause/resume example" FAIL "not built"
  fi
  timeout --kill-after=5 "$(budget_for 70)" python3 tests/gpu/clients/pause_rl_loop.py --shim "$SHIM" \
    --module-dir "$BUILD/python" --iters 20 --weights-gib 1 --kv-gib 2 >"$WORK/pause-rl.log" 2>&1
  rc=$?
  grep -vE '^RESULT ' "$WORK/pause-rl.log" | tail -40
  row "pause/resume torch RL loop" "$(status_of $rc)" "$(grep -E '^(PASS|FAIL) (preload|pluggable)|^FLOOR' "$WORK/pause-rl.log" | tr '\n' ' ' | cut -c1-400)$(timeout_note $rc)"
  # NCCL on a tagged buffer after a pause and resume (two GPUs; PAUSE.md "Limits").
  timeout --kill-after=5 "$(budget_for 150)" python3 tests/gpu/clients/pause_nccl.py --shim "$SHIM" \
    --module-dir "$BUILD/python" >"$WORK/pause-nccl.log" 2>&1
  rc=$?
  tail -20 "$WORK/pause-nccl.log"
  row "pause/resume NCCL after resume" "$(status_of $rc)" "$(grep -E '^(RESULT|SKIP)' "$WORK/pause-nccl.log" | sed 's/^RESULT //' | tr '\n' ';' | cut -c1-400)$(timeout_note $rc)"
fi

# --- 5c. torch_memory_saver's own suite (issue 35) ---------------------------------
# Only where a copy of it sits in an ignored directory (TMS_DIR, default
# .tms; tests/gpu/run_tms_suite.sh says the layout); GPU_CHECK_TMS_ROUTES
# picks the routes (default all three: preload nocache pluggable).  A route
# passes when its only failures are those docs/PAUSE.md lists for it.
banner "5c. torch_memory_saver's suite"
if runs_with_shim 5c "tms suite"; then
  TMS_ROUTE_TIMEOUT=$(budget_for 400) timed tms "$(budget_for 420)" tests/gpu/run_tms_suite.sh "$SHIM" \
    "$BUILD/python" "$WORK/tms" "${GPU_CHECK_TMS_ROUTES:-preload nocache pluggable}"
  rc=$?
  while read -r line; do
    st=PASS
    [[ $line == *SKIP* ]] && st=SKIP
    [[ $line == *unexpected:* || $line == *"no summary"* ]] && st=FAIL
    row "${line%%:*}" "$st" "${line#*: }"
  done < <(grep -E '^tms ' "$WORK/tms.log")
  grep -qE '^tms ' "$WORK/tms.log" || row "tms suite" "$(status_of $rc)" "no result (exit $rc$(timeout_note $rc))"
fi

# --- 6. benchmarks ---------------------------------------------------------------
banner "6. allocation latency (host ns per malloc+free pair)"
: >"$WORK/bench.txt"
if left_out 6; then
  row "bench" SKIP "left out (GPU_CHECK_SKIP)"
elif (( ! HAVE_GPU )); then
  row "bench" SKIP "no GPU"
else
  bench_rc=0
  for variant in static shared; do
    prog="$BUILD/examples/gpu_alloc_bench_$variant"
    [[ -x "$prog" ]] || { echo "$prog not built"; bench_rc=1; continue; }
    timed "bench-$variant-bare" "$(budget_for 60)" env -u LD_PRELOAD "$prog" "$variant-cudart" || bench_rc=1
    cat "$WORK/bench-$variant-bare.log" >>"$WORK/bench.txt"
    if [[ -n "$SHIM" ]]; then
      timed "bench-$variant-shim" "$(budget_for 60)" env LD_PRELOAD="$SHIM" "$prog" "$variant-cudart" || bench_rc=1
      cat "$WORK/bench-$variant-shim.log" >>"$WORK/bench.txt"
    fi
  done
  python3 tests/gpu/bench_table.py "$WORK/bench.txt" --rows "$WORK/bench-rows.tsv" | tee "$WORK/bench-table.txt"
  if [[ -s "$WORK/bench-rows.tsv" ]]; then
    [[ $bench_rc -eq 0 ]] && cat "$WORK/bench-rows.tsv" >>"$ROWS" || sed 's/\tPASS\t/\tFAIL\t/' "$WORK/bench-rows.tsv" >>"$ROWS"
  else
    row "bench" FAIL "no figures (see bench logs)"
  fi
  # The exported cudaMalloc family vs the driver route alone, for a
  # shared-cudart program: the same benchmark under a shim built with
  # -Druntime_hooks=false.
  prog="$BUILD/examples/gpu_alloc_bench_shared"
  if [[ -x "$prog" && -n "$SHIM" ]]; then
    nort="$BUILD-noruntime"
    if timeout 120 meson setup --reconfigure "$nort" "${setup_args[@]}" -Druntime_hooks=false >/dev/null 2>&1 ||
       timeout 120 meson setup "$nort" "${setup_args[@]}" -Druntime_hooks=false >/dev/null 2>&1; then
      timeout 180 ninja -C "$nort" shim/libcachalloc.so >/dev/null 2>&1
    fi
    if [[ -f "$nort/shim/libcachalloc.so" ]]; then
      timed bench-shared-noruntime "$(budget_for 60)" env LD_PRELOAD="$nort/shim/libcachalloc.so" "$prog" shared-cudart-driver-route
      grep '^BENCH' "$WORK/bench-shared-noruntime.log" | sed 's/shim=yes/shim=driver-route-only/' >>"$WORK/bench.txt"
      on=$(grep 'variant=shared-cudart shim=yes path=cudaMalloc+cudaFree case=1MiB' "$WORK/bench.txt" | grep -o 'ns=[0-9]*' | head -1)
      off=$(grep 'shim=driver-route-only path=cudaMalloc+cudaFree case=1MiB' "$WORK/bench.txt" | grep -o 'ns=[0-9]*' | head -1)
      row "bench runtime exports (shared cudart)" PASS "1 MiB pair: with cudaMalloc exports ${on#ns=} ns, driver route only ${off#ns=} ns"
    else
      row "bench runtime exports (shared cudart)" FAIL "shim without runtime hooks not built"
    fi
  fi
  grep '^BENCH' "$WORK/bench.txt" >"$OUTDIR/bench.txt"
  cat "$WORK/bench-table.txt" >>"$OUTDIR/bench.txt"
fi

# --- 7. configurations, observability, core benchmark --------------------------
banner "7. configurations, observability, core benchmark"
ex="$BUILD/examples/alloc_patterns_static"
if left_out 7; then
  row "configs/observability" SKIP "left out (GPU_CHECK_SKIP)"
elif (( HAVE_GPU )) && [[ -x "$ex" && -n "$SHIM" ]]; then
  # Other allocator configurations must keep every pattern's data intact.
  for conf in expandable_segments:true free_sync:fence free_sync:device \
              max_split_size_mb:64,roundup_power2_divisions:4,garbage_collection_threshold:0.6; do
    timeout --kill-after=10 "$(budget_for 90)" env LD_PRELOAD="$SHIM" CACHALLOC_CONF="$conf" "$ex" \
      >"$WORK/conf-$conf.log" 2>&1
    rc=$?
    if [[ $rc -eq 0 ]] && grep -qE ': PASS$' "$WORK/conf-$conf.log"; then row "config $conf" PASS "alloc_patterns intact"
    else row "config $conf" FAIL "exit $rc$(timeout_note $rc): $(grep -m1 -iE 'fail|error' "$WORK/conf-$conf.log" | cut -c1-80)"; fi
  done
  # The OOM report: one readable error message (with NVML's per-process lines when present).
  timeout --kill-after=10 "$(budget_for 60)" env LD_PRELOAD="$SHIM" "$ex" oom >"$WORK/oom.log" 2>&1
  echo "--- OOM report"; grep -iA12 'out of memory' "$WORK/oom.log" | head -30
  if grep -q 'out of memory' "$WORK/oom.log" && grep -qE ': PASS$' "$WORK/oom.log"; then
    row "oom report" PASS "$(grep -c 'process' "$WORK/oom.log") NVML process lines"
  else row "oom report" FAIL "no report or pattern failed"; fi
  # Stats JSON, trace and snapshot of a real example and of a PyTorch step; plots of both timelines.
  timeout --kill-after=10 "$(budget_for 90)" env LD_PRELOAD="$SHIM" \
    CACHALLOC_CONF="stats:$WORK/ex-stats.json,trace:$OUTDIR/example-trace.json,snapshot:$WORK/ex-snap.json" \
    "$ex" sizes async threads >"$WORK/obs-example.log" 2>&1
  rc=$?
  timeout --kill-after=10 "$(budget_for 120)" env LD_PRELOAD="$SHIM" PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
    CACHALLOC_CONF="stats:$WORK/torch-stats.json,trace:$WORK/torch-trace.json" \
    python3 tests/gpu/clients/torch_train_step.py >"$WORK/obs-torch.log" 2>&1
  rc_t=$?
  plots=""
  for name in example torch; do
    trace="$OUTDIR/example-trace.json"; [[ $name == torch ]] && trace="$WORK/torch-trace.json"
    if [[ -s $trace ]] && python3 scripts/cachalloc-report plot "$trace" -o "$OUTDIR/$name-timeline.png" >>"$WORK/plots.log" 2>&1; then
      plots+=" $name-timeline.png"
    fi
  done
  python3 scripts/cachalloc-report summary "$WORK/torch-stats.json" 2>&1 | head -40
  if [[ $rc -eq 0 && $rc_t -eq 0 && -s "$WORK/ex-stats.json" && -s "$WORK/torch-stats.json" && -s "$WORK/ex-snap.json" ]]; then
    row "observability dumps" PASS "stats+trace+snapshot written; plots:${plots:- none ($(tail -1 "$WORK/plots.log" 2>/dev/null | cut -c1-60))}"
  else row "observability dumps" FAIL "example exit $rc, torch exit $rc_t"; fi
else
  row "configs/observability" SKIP "no GPU or not built"
fi
if [[ -x "$BUILD/bench/core_bench" ]]; then
  timed core-bench "$(budget_for 60)" "$BUILD/bench/core_bench" 7
  { echo "core_bench (fake backend, this machine's CPU):"; cat "$WORK/core-bench.log"; } >>"$OUTDIR/bench.txt"
  row "core bench" PASS "$(grep -m1 '512 B |' "$WORK/core-bench.log" | awk -F'|' '{print $3}' | tr -d ' ') ns per 512 B pair"
fi

# --- 8. numba-cuda's test suites, then the results ------------------------------------
if [[ $NUMBA_MODE == 1 ]]; then
  numba_suites_step
else
  row "numba suites" SKIP "not run (GPU_CHECK_NUMBA=1 or =only runs them, about 10 minutes)"
fi
if [[ $RELIABILITY_MODE == 1 ]]; then
  reliability_step
else
  row "reliability" SKIP "not run (GPU_CHECK_RELIABILITY=1 or =only: compute-sanitizer and a soak, about 10 minutes)"
fi
finish
