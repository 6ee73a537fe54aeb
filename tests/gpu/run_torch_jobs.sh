#!/usr/bin/env bash
# run_torch_jobs.sh — PyTorch with cachalloc on a GPU machine, every way
# (issue 9; docs/PYTORCH.md), bare and under cachalloc, results compared.
#
#   tests/gpu/run_torch_jobs.sh [BUILD_DIR]
#
#   1. examples/torch_pluggable.py: PyTorch's allocator (bare), the same
#      under LD_PRELOAD with PYTORCH_NO_CUDA_MEMORY_CACHING=1, and cachalloc
#      as PyTorch's pluggable allocator: the three must print identical
#      RESULT lines (losses, parameter checksum); step times compared
#   2. examples/torch_mempool.py --compare: one region in a cachalloc MemPool
#      against the same run without
#   3. examples/multi_gpu_{static,shared} bare and under LD_PRELOAD (two GPUs;
#      SKIP with one)
#   4. tests/gpu/clients/ddp_train.py under torchrun --nproc-per-node N (N =
#      GPUs, at most 2): native, preload (LD_PRELOAD inherited through
#      torchrun, PYTORCH_NO_CUDA_MEMORY_CACHING=1) and pluggable; per-rank
#      losses identical across the three, one stats dump per rank
#      (stats:DIR/stats-%r.json) for preload and pluggable
# and prints LAST a table (check, PASS/FAIL/SKIP, figures) and the step-time
# table: per job, allocator and rank, the median step time and the peak
# reserved memory (PyTorch's max_memory_reserved for native, cachalloc's dump
# otherwise).
#
# BUILD_DIR: the meson build holding shim/libcachalloc.so, examples/ and
# python/cachalloc.py (default: $BUILD_DIR, else build-gpu, else build).
# Environment: OUT (artefacts, default ./torch-jobs-out: every log and dump),
# JOBS_BUDGET (seconds for the whole run, default 300), NPROC (ranks for the
# DDP job; default min(2, GPUs)), STEPS (DDP steps, default 20).
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
# NVSHMEM_DISABLE_NVLS=1 are exported for every run).
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
START=$(date +%s)
BUDGET=${JOBS_BUDGET:-300}
OUTDIR=${OUT:-$ROOT/torch-jobs-out}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
ROWS="$OUTDIR/rows.tsv"
TIMES="$OUTDIR/times.tsv"
: >"$ROWS"
: >"$TIMES"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG:-:4096:8}

BUILD=${1:-${BUILD_DIR:-}}
if [[ -z "$BUILD" ]]; then
  for b in build-gpu build; do [[ -e "$b/shim/libcachalloc.so" ]] && { BUILD=$b; break; }; done
fi
SHIM=$( [[ -n "$BUILD" ]] && find "$BUILD" -name 'libcachalloc.so' \( -type f -o -type l \) 2>/dev/null | head -1)
[[ -n "$SHIM" ]] && SHIM=$(cd "$(dirname "$SHIM")" && pwd)/libcachalloc.so
if [[ -f "$BUILD/python/cachalloc.py" ]]; then
  export CACHALLOC_PYTHON=$(cd "$BUILD/python" && pwd)
fi
export CACHALLOC_LIBRARY=${SHIM:-}
PY=${PYTHON:-python3}

elapsed() { echo $(( $(date +%s) - START )); }
left() { local l=$(( BUDGET - $(elapsed) - 5 )); (( l < 10 )) && l=10; (( l > $1 )) && l=$1; echo "$l"; }
row() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$ROWS"; }
banner() { printf '\n===== %s  (t=%ss)\n' "$1" "$(elapsed)"; }
results() { grep '^RESULT ' "$1" 2>/dev/null; }
field() { sed -n "s/.*$2 \([0-9.]*\).*/\1/p" "$1" | head -1; }
# bare: no cachalloc at all (LD_PRELOAD and CACHALLOC_CONF removed).
# Command prefixes (arrays, not functions: `timeout` runs programs only).
BARE=(env -u LD_PRELOAD -u CACHALLOC_CONF -u PYTORCH_NO_CUDA_MEMORY_CACHING)
PRELOAD=(env "LD_PRELOAD=$SHIM${LD_PRELOAD:+:$LD_PRELOAD}")
# The peak reserved bytes of each rank's dump in a directory: "rank bytes" lines.
dump_peaks() {
  "$PY" - "$1" <<'PYEOF'
import glob, json, os, re, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "stats-*.json"))):
    rank = re.sub(r"^stats-(.*)\.json$", r"\1", os.path.basename(f))
    d = json.load(open(f))
    peak = max((dev["stats"].get("reserved_bytes.all.peak", 0) for dev in d["devices"]), default=0)
    allocs = sum(dev["stats"].get("allocation.all.allocated", 0) for dev in d["devices"])
    print(rank, peak, allocs)
PYEOF
}
mib() { awk -v b="$1" 'BEGIN { if (b < 0 || b == "") print "?"; else printf "%.0f", b / 1048576 }'; }

banner "machine"
GPUS=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  GPUS=$(nvidia-smi -L | grep -c '^GPU ')
  nvidia-smi -L
fi
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())' 2>&1 | tail -1
echo "build: ${BUILD:-none}  library: ${SHIM:-not built}  module: ${CACHALLOC_PYTHON:-repository python/}"
if [[ -z "$SHIM" ]]; then
  row "libcachalloc.so" FAIL "not built: meson setup build-gpu && ninja -C build-gpu"
fi
if (( GPUS == 0 )); then row "gpu" SKIP "no GPU: every check skipped"; fi

# --- 1. torch_pluggable: three ways -------------------------------------------
if (( GPUS > 0 )) && [[ -n "$SHIM" ]]; then
  banner "1. torch_pluggable.py: native, LD_PRELOAD (caching off), pluggable"
  ex="examples/torch_pluggable.py"
  timeout --kill-after=5 "$(left 120)" "${BARE[@]}" "$PY" "$ex" --allocator native >"$OUTDIR/pluggable-native.log" 2>&1
  rc_n=$?
  timeout --kill-after=5 "$(left 120)" "${PRELOAD[@]}" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
    CACHALLOC_CONF="stats:$OUTDIR/pluggable-preload-stats.json" \
    "$PY" "$ex" --allocator native >"$OUTDIR/pluggable-preload.log" 2>&1
  rc_p=$?
  timeout --kill-after=5 "$(left 120)" "${BARE[@]}" env CACHALLOC_CONF="stats:$OUTDIR/pluggable-pluggable-stats.json" \
    "$PY" "$ex" --allocator pluggable --summary >"$OUTDIR/pluggable-pluggable.log" 2>&1
  rc_g=$?
  tail -n 4 "$OUTDIR"/pluggable-*.log
  if (( rc_n == 77 )); then row "torch_pluggable" SKIP "$(tail -1 "$OUTDIR/pluggable-native.log")"
  else
    same=1
    results "$OUTDIR/pluggable-native.log" >"$OUTDIR/r-n"
    results "$OUTDIR/pluggable-preload.log" >"$OUTDIR/r-p"
    results "$OUTDIR/pluggable-pluggable.log" >"$OUTDIR/r-g"
    [[ -s "$OUTDIR/r-n" ]] && cmp -s "$OUTDIR/r-n" "$OUTDIR/r-p" && cmp -s "$OUTDIR/r-n" "$OUTDIR/r-g" || same=0
    for a in native preload pluggable; do
      log="$OUTDIR/pluggable-$a.log"
      ms=$(field "$log" median_step_ms)
      case $a in
        native) peak=-1 ;;
        *) peak=$(sed -n 's/.*"reserved_bytes.all.peak":\([0-9]*\).*/\1/p' "$OUTDIR/pluggable-$a-stats.json" 2>/dev/null | head -1) ;;
      esac
      printf 'torch_pluggable\t%s\t0\t%s\t%s\n' "$a" "${ms:-?}" "$(mib "${peak:--1}")" >>"$TIMES"
    done
    if (( rc_n == 0 && rc_p == 0 && rc_g == 0 && same )); then
      row "torch_pluggable (3 ways)" PASS "losses identical; step ms native $(field "$OUTDIR/pluggable-native.log" median_step_ms), preload $(field "$OUTDIR/pluggable-preload.log" median_step_ms), pluggable $(field "$OUTDIR/pluggable-pluggable.log" median_step_ms)"
    else
      row "torch_pluggable (3 ways)" FAIL "exit native $rc_n preload $rc_p pluggable $rc_g; RESULT lines $([[ $same == 1 ]] && echo identical || echo DIFFER)"
    fi
  fi

  # --- 2. torch_mempool ----------------------------------------------------------
  banner "2. torch_mempool.py --compare"
  timeout --kill-after=5 "$(left 150)" "${BARE[@]}" env CACHALLOC_CONF="stats:$OUTDIR/mempool-stats.json" \
    "$PY" examples/torch_mempool.py --compare >"$OUTDIR/mempool.log" 2>&1
  rc=$?
  grep -E '^(CACHALLOC|placement|NOTE|reference|compare|torch_mempool)' "$OUTDIR/mempool.log"
  case $rc in
    0) row "torch_mempool" PASS "region in a cachalloc MemPool: results identical to the run without; $(grep -m1 '^CACHALLOC' "$OUTDIR/mempool.log" | cut -d' ' -f2-)" ;;
    77) row "torch_mempool" SKIP "$(tail -1 "$OUTDIR/mempool.log")" ;;
    *) row "torch_mempool" FAIL "exit $rc ($OUTDIR/mempool.log)" ;;
  esac
fi

# --- 3. multi_gpu ------------------------------------------------------------------
if (( GPUS >= 2 )) && [[ -n "$SHIM" ]]; then
  for variant in static shared; do
    prog="$BUILD/examples/multi_gpu_$variant"
    if [[ ! -x "$prog" ]]; then row "multi_gpu_$variant" FAIL "not built (nvcc?)"; continue; fi
    banner "3. multi_gpu_$variant bare and under LD_PRELOAD"
    timeout --kill-after=5 "$(left 90)" "${BARE[@]}" "$prog" >"$OUTDIR/multi_gpu_$variant-bare.log" 2>&1
    rc_b=$?
    timeout --kill-after=5 "$(left 90)" "${PRELOAD[@]}" env CACHALLOC_CONF="stats:$OUTDIR/multi_gpu_$variant-stats.json" \
      "$prog" >"$OUTDIR/multi_gpu_$variant-shim.log" 2>&1
    rc_s=$?
    tail -n 3 "$OUTDIR/multi_gpu_$variant-bare.log" "$OUTDIR/multi_gpu_$variant-shim.log"
    devs=$(grep -o '"device":[0-9]*,"device_total"' "$OUTDIR/multi_gpu_$variant-stats.json" 2>/dev/null | sort -u | wc -l)
    if (( rc_b == 0 && rc_s == 0 && devs >= 2 )); then
      row "multi_gpu_$variant" PASS "bare and shim; $devs devices in the dump; $(grep -m2 'cachalloc device' "$OUTDIR/multi_gpu_$variant-shim.log" | sed 's/^ *//' | tr '\n' ';')"
    else
      row "multi_gpu_$variant" FAIL "exit bare $rc_b shim $rc_s, $devs devices in the dump"
    fi
  done
elif (( GPUS == 1 )); then
  row "multi_gpu" SKIP "one GPU (needs 2)"
fi

# --- 4. DDP under torchrun ---------------------------------------------------------
if (( GPUS > 0 )) && [[ -n "$SHIM" ]]; then
  N=${NPROC:-$(( GPUS < 2 ? GPUS : 2 ))}
  STEPS=${STEPS:-20}
  client="tests/gpu/clients/ddp_train.py"
  declare -A RC
  # native2 (DDP_NATIVE_TWICE=1): the native run again, to tell a difference
  # cachalloc makes from NCCL's own run-to-run variation.
  for a in native preload pluggable ${DDP_NATIVE_TWICE:+native2}; do
    banner "4. torchrun --nproc-per-node $N ddp_train.py --allocator=$a"
    dir="$OUTDIR/ddp-$a"
    rm -rf "$dir" && mkdir -p "$dir"
    run=("$PY" -m torch.distributed.run --standalone --nproc-per-node "$N" "$client" "--allocator=${a%2}" --steps "$STEPS")
    case $a in
      native|native2) timeout --kill-after=10 "$(left 150)" "${BARE[@]}" "${run[@]}" >"$dir/out.log" 2>&1 ;;
      preload) timeout --kill-after=10 "$(left 150)" "${PRELOAD[@]}" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
                 CACHALLOC_CONF="stats:$dir/stats-%r.json" "${run[@]}" >"$dir/out.log" 2>&1 ;;
      pluggable) timeout --kill-after=10 "$(left 150)" "${BARE[@]}" env CACHALLOC_CONF="stats:$dir/stats-%r.json" \
                   "${run[@]}" >"$dir/out.log" 2>&1 ;;
    esac
    RC[$a]=$?
    grep -E '^(TIME|PEAK|ddp_train)' "$dir/out.log" | sort
    # Each record matched on its own (not per line): ranks share stdout.
    grep -aoE 'RESULT rank [0-9]+ (step [0-9]+ loss|checksum) [^ ]+ 0x[0-9a-f.]+p[+-][0-9]+' "$dir/out.log" |
      sort -t' ' -k3,3n -k5,5n >"$dir/results.txt"
  done
  if [[ -n ${DDP_NATIVE_TWICE:-} ]]; then
    if cmp -s "$OUTDIR/ddp-native/results.txt" "$OUTDIR/ddp-native2/results.txt"; then
      row "ddp native twice" PASS "two native runs print identical RESULT lines"
    else
      row "ddp native twice" FAIL "two native runs differ: $(diff "$OUTDIR/ddp-native/results.txt" "$OUTDIR/ddp-native2/results.txt" | grep -c '^<') lines"
    fi
  fi
  if grep -q 'ddp_train: SKIP' "$OUTDIR/ddp-native/out.log"; then
    row "ddp torchrun" SKIP "$(grep -m1 'ddp_train: SKIP' "$OUTDIR/ddp-native/out.log")"
  else
    same=1
    [[ -s "$OUTDIR/ddp-native/results.txt" ]] || same=0
    for a in preload pluggable; do cmp -s "$OUTDIR/ddp-native/results.txt" "$OUTDIR/ddp-$a/results.txt" || same=0; done
    dumps_ok=1
    for a in preload pluggable; do
      n=$(ls "$OUTDIR/ddp-$a" | grep -c '^stats-.*\.json$')
      (( n == N )) || dumps_ok=0
      echo "ddp $a: $n per-rank dumps: $(ls "$OUTDIR/ddp-$a" | grep '^stats-' | tr '\n' ' ')"
    done
    passes=$(cat "$OUTDIR"/ddp-{native,preload,pluggable}/out.log | grep -c 'ddp_train: PASS')
    for a in native preload pluggable; do
      declare -A PEAKS=()
      if [[ $a != native ]]; then
        while read -r r p _; do PEAKS[$r]=$p; done < <(dump_peaks "$OUTDIR/ddp-$a")
      fi
      for ((r = 0; r < N; r++)); do
        ms=$(sed -n "s/^TIME rank $r allocator $a median_step_ms \([0-9.]*\).*/\1/p" "$OUTDIR/ddp-$a/out.log" | head -1)
        if [[ $a == native ]]; then
          peak=$(sed -n "s/^PEAK rank $r reserved_bytes \([0-9-]*\).*/\1/p" "$OUTDIR/ddp-$a/out.log" | head -1)
        else
          peak=${PEAKS[$r]:--1}
        fi
        printf 'ddp torchrun x%s\t%s\t%s\t%s\t%s\n' "$N" "$a" "$r" "${ms:-?}" "$(mib "${peak:--1}")" >>"$TIMES"
      done
    done
    if (( RC[native] == 0 && RC[preload] == 0 && RC[pluggable] == 0 && same && dumps_ok && passes == 3 * N )); then
      row "ddp torchrun x$N (NCCL)" PASS "per-rank losses identical native/preload/pluggable; $N dumps per cachalloc run"
    else
      row "ddp torchrun x$N (NCCL)" FAIL "exit native ${RC[native]} preload ${RC[preload]} pluggable ${RC[pluggable]}; losses $([[ $same == 1 ]] && echo identical || echo DIFFER); dumps $([[ $dumps_ok == 1 ]] && echo ok || echo MISSING); $passes/$((3 * N)) ranks PASS"
    fi
  fi
fi

# --- the tables ---------------------------------------------------------------------
echo
echo "step times (median after warm-up) and peak reserved memory"
printf '%-22s %-10s %-5s %14s %18s\n' job allocator rank "step ms" "peak reserved MiB"
while IFS=$'\t' read -r job a r ms peak; do
  printf '%-22s %-10s %-5s %14s %18s\n' "$job" "$a" "$r" "$ms" "$peak"
done <"$TIMES"
echo
echo "run_torch_jobs: $(elapsed) s, artefacts in $OUTDIR"
printf '%-28s %-5s %s\n' check status figures
fail=0
while IFS=$'\t' read -r name status figure; do
  printf '%-28s %-5s %s\n' "$name" "$status" "$figure"
  [[ $status == FAIL ]] && fail=1
done <"$ROWS"
exit $fail
