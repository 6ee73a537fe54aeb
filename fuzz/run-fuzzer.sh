#!/usr/bin/env bash
# run-fuzzer.sh — runs one libFuzzer target for meson's suite 'fuzz'.
#
#   run-fuzzer.sh fuzz EXE SEEDS WORK SECONDS [libFuzzer flags...]
#       fuzzes for SECONDS (FUZZ_SECONDS overrides it) starting from the
#       seed inputs in SEEDS; new inputs go to WORK (kept between runs),
#       a crashing input to WORK.artifacts/.
#   run-fuzzer.sh replay EXE DIR
#       runs every file of DIR once (the regression inputs); passes when
#       DIR holds none.
set -euo pipefail
mode=$1 exe=$2
# A leak, a UBSan report or an ASan error ends the run with a failure.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
case $mode in
  fuzz)
    seeds=$3 work=$4 seconds=${FUZZ_SECONDS:-$5}
    shift 5
    mkdir -p "$work" "$work.artifacts"
    echo "fuzzing $(basename "$exe") for ${seconds}s from $seeds"
    start=$SECONDS
    if ! "$exe" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
         -artifact_prefix="$work.artifacts/" "$@" "$work" "$seeds" 2>&1 | tee "$work.log"; then
      echo "CRASH: the input is in $work.artifacts/; keep it in fuzz/regressions/$(basename "$seeds")/ once fixed"
      exit 1
    fi
    # One line for docs/RELIABILITY.md: libFuzzer's final statistics.
    stat() { sed -n "s/^stat::$1: *//p" "$work.log" | tail -1; }
    echo "fuzz summary: $(basename "$exe"): $(stat number_of_executed_units) executions in" \
         "$((SECONDS - start)) s ($(stat average_exec_per_sec)/s), $(stat new_units_added) new inputs," \
         "corpus $(find "$work" -maxdepth 1 -type f | wc -l) files, peak RSS $(stat peak_rss_mb) MB" ;;
  replay)
    dir=$3
    files=()
    if [ -d "$dir" ]; then
      while IFS= read -r -d '' f; do files+=("$f"); done < <(find "$dir" -maxdepth 1 -type f -print0 | sort -z)
    fi
    if [ ${#files[@]} -eq 0 ]; then
      echo "no regression inputs in $dir"
      exit 0
    fi
    echo "replaying ${#files[@]} inputs from $dir"
    exec "$exe" -timeout=20 -rss_limit_mb=2048 "${files[@]}" ;;
  *) echo "usage: $0 fuzz EXE SEEDS WORK SECONDS [flags] | replay EXE DIR" >&2; exit 2 ;;
esac
