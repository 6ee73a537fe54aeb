#!/usr/bin/env bash
# run_under_shim.sh — runs one GPU example, with libcachalloc.so preloaded or
# without it, and checks that it printed PASS and (under the shim) that
# cachalloc's stats dump shows it served the allocations.
#
#   run_under_shim.sh --probe GPU_PROBE [--shim LIB.so --checker check_stats.py
#                     [--conf CACHALLOC_CONF] [--expect COND]...] -- PROGRAM [ARGS...]
#
# Exit 0 pass, 1 fail, 77 skip (no GPU: nvidia-smi missing or failing, or the
# probe finds no device), as meson test expects.  Without --shim the program
# runs bare: the baseline that proves the example itself is right.
set -u

probe="" shim="" checker="" conf="" expects=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --probe) probe="$2"; shift 2 ;;
    --shim) shim="$2"; shift 2 ;;
    --checker) checker="$2"; shift 2 ;;
    --conf) conf="$2,"; shift 2 ;;  # settings before the stats dump's
    --expect) expects+=("$2"); shift 2 ;;
    --) shift; break ;;
    *) echo "run_under_shim: unknown argument $1"; exit 2 ;;
  esac
done
[[ $# -ge 1 ]] || { echo "run_under_shim: no program given"; exit 2; }
name=$(basename "$1")

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "SKIP $name: no GPU here (nvidia-smi absent or failing)"
  exit 77
fi
if [[ -n "$probe" ]] && ! "$probe"; then
  echo "SKIP $name: no usable GPU"
  exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/cachalloc-gpu.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
out="$tmp/out.txt"
dump="$tmp/stats.json"

if [[ -n "$shim" ]]; then
  echo "running $name with LD_PRELOAD=$shim${conf:+ CACHALLOC_CONF=${conf%,}}"
  LD_PRELOAD="$shim${LD_PRELOAD:+:$LD_PRELOAD}" CACHALLOC_CONF="${conf}stats:$dump" "$@" >"$out" 2>&1
else
  echo "running $name without the shim"
  env -u LD_PRELOAD -u CACHALLOC_CONF "$@" >"$out" 2>&1
fi
rc=$?
cat "$out"

status=0
if [[ $rc -eq 77 ]]; then
  echo "SKIP $name: the program found no GPU"
  exit 77
fi
if [[ $rc -ne 0 ]]; then
  echo "FAIL $name: exit code $rc"
  status=1
fi
if ! grep -qE '^[a-z_]+: PASS$' "$out"; then
  echo "FAIL $name: no PASS line"
  status=1
fi
if [[ -n "$shim" ]]; then
  if [[ ! -s "$dump" ]]; then
    echo "FAIL $name: cachalloc wrote no stats dump to $dump"
    status=1
  elif ! python3 "$checker" "$dump" "${expects[@]}"; then
    echo "FAIL $name: the stats dump does not show cachalloc serving the allocations"
    status=1
  fi
fi
[[ $status -eq 0 ]] && echo "PASS $name"
exit $status
