#!/usr/bin/env bash
# run_sanitizer.sh — compute-sanitizer over the examples, bare and under
# libcachalloc.so (issue 10: "clean, with the same findings as without it").
#
#   run_sanitizer.sh SHIM BUILD OUTDIR ROWS
#
# For each (tool, program, patterns) below: the program under
# `compute-sanitizer --tool TOOL` once bare and once with LD_PRELOAD=SHIM;
# a row is PASS when both runs exit 0 and report the same number of errors
# ("ERROR SUMMARY: N errors"), which must be 0.  Note what memcheck can see
# under cachalloc: it tracks driver allocations, i.e. cachalloc's segments,
# so an overrun that stays inside a segment is not reported there (the bare
# driver's own sub-allocated small allocations have the same blind spot).
set -u
SHIM=$1 BUILD=$2 OUT=$3 ROWS=$4
mkdir -p "$OUT"
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [[ ! -x $CS ]]; then printf 'compute-sanitizer\tSKIP\tnot installed\n' >>"$ROWS"; exit 0; fi

errors_in() { grep -o 'ERROR SUMMARY: [0-9]* error' "$1" | grep -o '[0-9]*' | tail -1; }

check() {  # check TOOL PROGRAM [PATTERNS...]
  local tool=$1 prog=$2; shift 2
  local exe="$BUILD/examples/$prog" name="$tool $prog${*:+ ($*)}"
  if [[ ! -x $exe ]]; then printf '%s\tFAIL\tnot built\n' "compute-sanitizer $name" >>"$ROWS"; return; fi
  local log="$OUT/$tool-$prog" t0 rc_b rc_s e_b e_s secs
  t0=$(date +%s)
  timeout 240 "$CS" --tool "$tool" --error-exitcode 0 "$exe" "$@" >"$log-bare.log" 2>&1; rc_b=$?
  timeout 240 env LD_PRELOAD="$SHIM" "$CS" --tool "$tool" --error-exitcode 0 "$exe" "$@" >"$log-shim.log" 2>&1; rc_s=$?
  secs=$(( $(date +%s) - t0 ))
  e_b=$(errors_in "$log-bare.log"); e_s=$(errors_in "$log-shim.log")
  local fig="errors bare ${e_b:-?} shim ${e_s:-?}; exit bare $rc_b shim $rc_s; ${secs} s"
  if [[ $rc_b -eq 0 && $rc_s -eq 0 && -n $e_s && $e_s == "${e_b:-x}" && $e_s -eq 0 ]]; then
    printf '%s\tPASS\t%s\n' "compute-sanitizer $name" "$fig" >>"$ROWS"
  else
    printf '%s\tFAIL\t%s\n' "compute-sanitizer $name" "$fig" >>"$ROWS"
  fi
}

check memcheck driver_patterns
check memcheck alloc_patterns_static sizes async threads fence_blocking graph
check memcheck fidelity_patterns_static range_memset attributes_freed reset
[[ -x "$BUILD/examples/stress_patterns_static" ]] && check memcheck stress_patterns_static 5
check racecheck alloc_patterns_static sizes async
check synccheck alloc_patterns_static sizes async
[[ -x "$BUILD/examples/stress_patterns_static" ]] && check racecheck stress_patterns_static 3
exit 0
