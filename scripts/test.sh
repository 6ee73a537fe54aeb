#!/usr/bin/env bash
# test.sh — the README's test command: installs what is missing (Debian
# packages), builds, runs every test suite this machine can run, in four
# phases, then prints each phase's wall time and ends with the line
# 'N passed, N failed' counting test cases.
#
#   default  build/        unit, integration, hostile, stress, gpu (skips
#                          without a GPU), slow
#   asan     build-asan/   ASan + UBSan and the core's debug checks
#                          (-Dcachalloc_debug=true): unit, integration,
#                          hostile, stress (the preloaded shim built so too)
#   tsan     build-tsan/   ThreadSanitizer: the unit tests that start threads
#                          (suite threads), integration, hostile, stress
#   fuzz     build-fuzz/   libFuzzer targets (clang, ASan + UBSan), meson
#                          suite 'fuzz': each fuzzes FUZZ_SECONDS (30) from
#                          fuzz/corpus/ and replays fuzz/regressions/
#   summary                wall time of each phase, then the count
#
# The first two are the quick configuration, the last two the heavy one.
# Measured from a clean copy on a slow 2-core machine (aa5d077): default
# 9:25 (the build with the examples and benchmarks, the slow suite), asan
# 7:07, tsan 11:07, fuzz 1:56: 30 minutes, within CI's 90.  `scripts/test.sh --quick`
# runs only default and asan, `scripts/test.sh --phases "tsan fuzz"` any
# subset.
# Suites that do not exist (yet) are left out.  Exit status 1 if anything
# failed or did not build.
set -uo pipefail
cd "$(dirname "$0")/.."

phases="default asan tsan fuzz"
case "${1:-}" in
  "") ;;
  --quick) phases="default asan" ;;
  --phases) phases=${2:?--phases needs a list, e.g. \"asan fuzz\"} ;;
  *) echo "usage: $0 [--quick | --phases \"default asan tsan fuzz\"]" >&2; exit 2 ;;
esac

scripts/install-deps.sh || { echo "could not install the build dependencies"; exit 1; }

jobs=$(nproc)
status=0
logs=()     # meson test logs that the summary counts
broken=()   # count-tests.py arguments for phases that could not build
times=()    # "phase seconds" for the summary

# configure DIR [meson setup options...]: configures DIR once (a later run
# reuses it; delete the directory to change its options).
configure() {
  local dir=$1; shift
  [ -f "$dir/build.ninja" ] && return 0
  meson setup "$dir" "$@" >"$dir.setup.log" 2>&1 || { cat "$dir.setup.log"; return 1; }
}

# build DIR: builds everything in DIR.
build() {
  ninja -C "$1" -j "$jobs" >"$1.ninja.log" 2>&1 || { tail -50 "$1.ninja.log"; return 1; }
}

# tests_of DIR EXCLUDE SUITE...: the names of DIR's tests in any of the
# suites, minus those whose name matches the regular expression EXCLUDE.
# Suites without tests are simply not there.
tests_of() {
  local dir=$1 exclude=$2; shift 2
  meson introspect "$dir" --tests | python3 -c '
import json, re, sys
exclude, suites = sys.argv[1], set(sys.argv[2:])
for t in json.load(sys.stdin):
    if suites & {s.split(":")[-1] for s in t["suite"]} and not (exclude and re.search(exclude, t["name"])):
        print(t["name"])' "$exclude" "$@"
}

# run_tests DIR LOGBASE [meson test options and test names...]: runs the
# tests (meson builds what they need first) and keeps the log for the
# summary.  The log has a name of its own so that two runs in one build
# directory do not overwrite each other's counts.
run_tests() {
  local dir=$1 logbase=$2 log=$2 prev="" a; shift 2
  for a in "$@"; do  # meson adds the wrapper's name to the log's
    [ "$prev" = --wrapper ] && log="$logbase-$(basename "${a%% *}")"
    prev=$a
  done
  rm -f "$dir/meson-logs/$log.json"
  meson test -C "$dir" --print-errorlogs --num-processes "$jobs" --logbase "$logbase" "$@" || status=1
  if [ -f "$dir/meson-logs/$log.json" ]; then logs+=("$dir/meson-logs/$log.json"); else status=1; fi
}

# The integration tests preload libcachalloc.so into their programs.  Under a
# sanitizer both are instrumented, and the sanitizer's runtime must be the
# first library of the process (it checks), but a preloaded library comes
# before the program's own DT_NEEDED runtime.  tests/sanitize/preload_first.c,
# run as meson's test wrapper, puts the runtime first in LD_PRELOAD whenever
# LD_PRELOAD names libcachalloc.so; it is static, so the LD_PRELOAD that meson
# hands it (the test's own) does not apply to it.
wrapper() {  # wrapper DIR RUNTIME: prints the --wrapper value, or fails
  local dir=$1 runtime
  runtime=$(gcc -print-file-name="$2")
  [ -f "$runtime" ] || { echo "no $2 (gcc -print-file-name)" >&2; return 1; }
  gcc -O2 -static -o "$dir/preload-first" tests/sanitize/preload_first.c || return 1
  echo "$PWD/$dir/preload-first $runtime"
}

# Not run under a sanitizer, each for the reason given; all run in build/.
#   untouched_non_cuda_process  preloads the shim into /bin/true and sh, which
#                               are not instrumented: a sanitized shim cannot
#                               load there (it checks that nothing was touched)
#   launcher                    compares LD_PRELOAD with the exact text the
#                               launcher sets, and preloads into sh
#   shim_exports_and_needed     the sanitizers' runtimes are extra DT_NEEDED
#                               entries and symbols of the library
#   fake_driver_vm_access       checks that touching unmapped fake device
#                               memory raises SIGSEGV, which the sanitizer's
#                               own SIGSEGV handler turns into a report
#   life_untouched_programs     preloads the shim into sh, python3 and cc and
#                               compares their exit status and output with
#                               and without it: the sanitized shim brings its
#                               runtime into those programs, and its leak
#                               checker reports their own allocations at exit
#                               (bash's, CPython's, gcc's), changing both
#   install_pkg_config          links a program against the installed
#                               library, which is the sanitized one there
#                               (it checks packaging, not memory)
sanitizer_skip='^(untouched_non_cuda_process|launcher|shim_exports_and_needed|fake_driver_vm_access|life_untouched_programs|install_pkg_config)$'
# Under ThreadSanitizer only:
#   python_module,              load libcachalloc.so into python3 with
#   python_torch_memory,        ctypes.CDLL: the TSan-built library needs
#   python_memory_saver
#                               libtsan, which cannot be dlopen'ed into a
#                               process that did not start with it ("cannot
#                               allocate memory in static TLS block")
#   pause_shim_ cycle,          single-threaded programs: pause_shim.c starts
#   resume_oom, random_faults,  no thread, nor does the shim for backups of up
#   disk_*                      to 128 MiB (pause_shim_big_host_backup, whose
#                               160 MiB backup fresh_pinned.cpp fills with
#                               threads, stays).  ThreadSanitizer has nothing
#                               to find there, and their copies took 225 of
#                               its phase's 1,617 test seconds; ASan runs them
tsan_skip='^(python_module|python_torch_memory|python_memory_saver|pause_shim_(cycle|resume_oom|random_faults|disk_.*))$'
sanitizer_suites="unit integration hostile stress"
# ThreadSanitizer: of the unit tests only suite 'threads', those that run
# more than one thread (tests/unit/meson.build says why).
tsan_suites="threads integration hostile stress"
# -O0 (buildtype debug): with ASan + UBSan, gcc takes 3 times as long to
# compile the shim at -O2 as at -O0, and the tests are short.  b_lundef=false:
# the sanitizers' symbols come from their runtimes at run time.
sanitizer_options=(-Dbuildtype=debug -Db_lundef=false -Dbench=false -Dgpu_tests=disabled)
# hostile_signals_nested: 10 rounds instead of 40, hostile_signals_during_dump
# 4 rounds of each exit signal instead of 12 (a round takes seconds under a
# sanitizer: 246 s of ThreadSanitizer's phase went to the 24 exit dumps; the
# default build runs them all).
nested_rounds_sanitized=10
exit_rounds_sanitized=4
# Meson's timeouts are set for the default build.  Under ThreadSanitizer the
# stress runs and the Python harnesses take 5 to 15 times as long, which on
# a slow 2-core machine put stress_expandable at 118 s of its 120 (and over
# it in CI on 435cde1): the sanitizer phases triple every timeout, so a
# timeout there still means a hang, not a slow machine.
sanitizer_timeouts=(--timeout-multiplier 3)

phase_default() {
  echo "== build (build/)"
  configure build && build build || return 1
  echo "== tests: unit, integration, hostile, stress, gpu, slow (build/)"
  local names
  names=$(tests_of build "" unit integration hostile stress gpu slow) || return 1
  [ -n "$names" ] || return 1
  run_tests build testlog $names
}

phase_asan() {
  echo "== ASan + UBSan: ${sanitizer_suites} (build-asan/)"
  # -Dcachalloc_debug=true: the core's own checks too (CACHALLOC_ASSERT,
  # every block phase change against core/block.h's table); they abort.
  configure build-asan "${sanitizer_options[@]}" -Db_sanitize=address,undefined -Dcachalloc_debug=true ||
    return 1
  local wrap names
  wrap=$(wrapper build-asan libasan.so) || return 1
  names=$(tests_of build-asan "$sanitizer_skip" $sanitizer_suites) || return 1
  [ -n "$names" ] || return 1
  # UBSAN_OPTIONS halt_on_error: UBSan only prints by default; a report must
  #   fail the test.
  # ASAN_OPTIONS detect_leaks: LeakSanitizer at every exit, the preloaded
  #   runs included, less the memory tests/sanitize/lsan.supp names (leaked
  #   by design).
  # ASAN_OPTIONS verify_asan_link_order=0: test_obs_shim.sh sets LD_PRELOAD
  #   to the shim alone, inside the script, where the wrapper cannot put the
  #   runtime first.  The programs it starts are instrumented and load the
  #   runtime themselves, right after the shim; the shim defines none of the
  #   functions ASan intercepts (its dlsym is not one), so nothing that ASan
  #   sees changes, but ASan would refuse to start.
  # Programs that the tests start (fork/exec, IPC children) inherit these.
  SIGNALS_NESTED_ROUNDS=$nested_rounds_sanitized SIGNALS_EXIT_ROUNDS=$exit_rounds_sanitized \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  ASAN_OPTIONS=detect_leaks=1:verify_asan_link_order=0 \
  LSAN_OPTIONS=suppressions=$PWD/tests/sanitize/lsan.supp:print_suppressions=0 \
    run_tests build-asan testlog-asan "${sanitizer_timeouts[@]}" --wrapper "$wrap" $names
}

phase_tsan() {
  echo "== ThreadSanitizer: ${tsan_suites} (build-tsan/)"
  configure build-tsan "${sanitizer_options[@]}" -Db_sanitize=thread || return 1
  local wrap names
  wrap=$(wrapper build-tsan libtsan.so) || return 1
  names=$(tests_of build-tsan "$sanitizer_skip|$tsan_skip" $tsan_suites) || return 1
  [ -n "$names" ] || return 1
  # halt_on_error: the first report fails the test (exit status 66).
  # report_signal_unsafe=0: the shim writes its reports from its SIGTERM,
  #   SIGINT and snapshot_signal handlers, which allocates; that risk is
  #   accepted by design (shim/exit_hooks.cpp, docs/OBSERVABILITY.md), and
  #   test_obs_exit_hooks and test_obs_shim exercise exactly that.
  SIGNALS_NESTED_ROUNDS=$nested_rounds_sanitized SIGNALS_EXIT_ROUNDS=$exit_rounds_sanitized \
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:report_signal_unsafe=0 \
    run_tests build-tsan testlog-tsan "${sanitizer_timeouts[@]}" --wrapper "$wrap" $names
}

phase_fuzz() {
  echo "== fuzzing: suite fuzz, ${FUZZ_SECONDS:-30}s per target (build-fuzz/)"
  CC=clang CXX=clang++ configure build-fuzz -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false \
    -Dbench=false -Dgpu_tests=disabled || return 1
  # Only the fuzz targets are built: meson test builds what the tests need.
  run_tests build-fuzz testlog-fuzz --suite fuzz
}

for phase in $phases; do
  start=$SECONDS
  if ! declare -F "phase_$phase" >/dev/null; then
    echo "unknown phase '$phase'"; status=1; broken+=(--failed "unknown phase $phase"); continue
  fi
  if ! "phase_$phase"; then
    echo "== $phase: could not configure or build"
    status=1
    broken+=(--failed "$phase (could not configure or build)")
  fi
  times+=("$phase $((SECONDS - start))")
done

echo "== summary"
for t in "${times[@]}"; do
  set -- $t
  printf '%-8s %4d:%02d\n' "$1" $(($2 / 60)) $(($2 % 60))
done
python3 scripts/count-tests.py "${logs[@]}" "${broken[@]}" || status=1
exit $status
