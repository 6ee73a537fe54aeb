#!/usr/bin/env bash
# record-traces.sh — issue 8, item 4 (memory), on the GPU machine, from the
# repository root:
#
#   bench/record-traces.sh [OUTDIR]          # OUTDIR: default $OUT, else ./mem-traces-out
#
# For each real program of bench/programs (train_varlen: a transformer
# training loop whose shapes change every step; train_varlen_side: the same
# with a non-blocking side stream; hf_gpt2: a HuggingFace GPT-2 with random
# weights, training then generating):
#   1. one run under cachalloc, PyTorch's own cache off, with its allocation
#      timeline and its statistics dump:
#        LD_PRELOAD=$BUILD/shim/libcachalloc.so PYTORCH_NO_CUDA_MEMORY_CACHING=1
#        CACHALLOC_CONF=trace:W/NAME-%p.json,trace_max_entries:4000000,stats:W/NAME-%p.stats.json
#   2. runs WITHOUT cachalloc, PyTorch's allocator, for each PyTorch setting
#      (NATIVE_SETTINGS): its figures from torch.cuda.memory_stats() at the end
#      of the run (bench/programs/mem_stats.py prints them as TORCH_MEMORY_STATS;
#      peaks cover the whole run);
# then, still on the GPU machine (no GPU needed for these):
#   3. bench/trace_replay replays every trace through the core on the fake
#      backend under each setting (OUTDIR/replay.json, OUTDIR/replay.md);
#   4. bench/memory_report.py puts the replay's figures beside PyTorch's
#      (OUTDIR/memory-report.md, also printed last).
# The traces themselves come back in trace_replay's compact form, gzipped
# (OUTDIR/traces/NAME-PID.replay.gz: a few MB), when under MAX_COPY_MB each;
# replay them anywhere with
#   build-h4/bench/trace_replay OUTDIR/traces/*.replay.gz
# The raw Chrome-trace JSON (hundreds of bytes per event) stays on the machine.
#
# Environment:
#   BUILD_DIR        build directory (default build-gpu, as gpu-check.sh/run-all.sh);
#                    configured and built here when the shim or trace_replay is missing
#   SKIP_BUILD=1     use what BUILD_DIR has
#   PROGRAMS         subset of "train_varlen train_varlen_side hf_gpt2" (default all three)
#   STEPS, WARMUP    train_varlen's --steps/--warmup (default 24/4, as run-all.sh)
#   HF_STEPS         hf_gpt.py's --steps (default 16)
#   NATIVE_SETTINGS  "two" (default): PyTorch's defaults and expandable_segments:True;
#                    "all": also every setting trace_replay shows (6 more runs per program)
#   TRACE_MAX_ENTRIES  ring size (default 4000000; 64 B per entry in the process)
#   MAX_COPY_MB      largest compact trace copied to OUTDIR (default 8)
#   RUN_TIMEOUT      seconds per program run (default 300)
#   PYTHON           (default python3)
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
source scripts/gpu-build.sh
START=$(date +%s)
OUTDIR=${1:-${OUT:-$ROOT/mem-traces-out}}
BUILD=${BUILD_DIR:-build-gpu}
PY=${PYTHON:-python3}
STEPS=${STEPS:-24}
WARMUP=${WARMUP:-4}
HF_STEPS=${HF_STEPS:-16}
PROGRAMS=${PROGRAMS:-train_varlen train_varlen_side hf_gpt2}
NATIVE_SETTINGS=${NATIVE_SETTINGS:-two}
TRACE_MAX_ENTRIES=${TRACE_MAX_ENTRIES:-4000000}
MAX_COPY_MB=${MAX_COPY_MB:-8}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUTDIR/traces" "$OUTDIR/logs" "$OUTDIR/stats"
OUTDIR=$(cd "$OUTDIR" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/record-traces.XXXXXX")
mkdir -p "$WORK/traces"
exec > >(tee "$OUTDIR/record-traces.log") 2>&1
elapsed() { echo $(( $(date +%s) - START )); }
banner() { printf '\n===== %s  (t=%ss)\n' "$1" "$(elapsed)"; }

# PyTorch settings: label and PYTORCH_CUDA_ALLOC_CONF.  The labels are the
# cachalloc settings trace_replay prints (PyTorch spells the boolean True).
declare -a NATIVE_LABELS NATIVE_CONFS
native() { NATIVE_LABELS+=("$1"); NATIVE_CONFS+=("$2"); }
native "" ""
native "expandable_segments:true" "expandable_segments:True"
if [[ $NATIVE_SETTINGS == all ]]; then
  native "roundup_power2_divisions:4" "roundup_power2_divisions:4"
  native "roundup_power2_divisions:8" "roundup_power2_divisions:8"
  native "roundup_power2_divisions:[256:1,512:2,>:8]" "roundup_power2_divisions:[256:1,512:2,>:8]"
  native "max_split_size_mb:64" "max_split_size_mb:64"
  native "max_split_size_mb:256" "max_split_size_mb:256"
  native "expandable_segments:true,roundup_power2_divisions:[256:1,512:2,>:8]" \
         "expandable_segments:True,roundup_power2_divisions:[256:1,512:2,>:8]"
fi

program_args() {  # NAME -> the script and its arguments
  case $1 in
    train_varlen) echo "bench/programs/train_varlen.py --steps $STEPS --warmup $WARMUP" ;;
    train_varlen_side) echo "bench/programs/train_varlen.py --side-stream --steps $STEPS --warmup $WARMUP" ;;
    hf_gpt2) echo "bench/programs/hf_gpt.py --steps $HF_STEPS --warmup 3" ;;
    *) return 1 ;;
  esac
}

# --- 1. machine and build ------------------------------------------------------
banner "machine"
nvidia-smi -L 2>/dev/null || echo "nvidia-smi: no GPU listed"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())' \
  2>&1 | tail -1
"$PY" -c 'import transformers; print("transformers", transformers.__version__)' 2>&1 | tail -1
for f in bench/programs/train_varlen.py bench/programs/hf_gpt.py bench/programs/mem_stats.py; do
  [[ -f $f ]] || { echo "missing $f: this script runs the programs of bench/programs"; exit 1; }
done

banner "build ($BUILD)"
SHIM="$BUILD/shim/libcachalloc.so"
REPLAY="$BUILD/bench/trace_replay"
if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  gpu_setup_args
  configure_build "$BUILD" "$WORK/configure.log" || { tail -20 "$WORK/configure.log"; echo "meson setup failed"; exit 1; }
  timeout 400 ninja -C "$BUILD" -j "$JOBS" shim/libcachalloc.so bench/trace_replay >"$WORK/ninja.log" 2>&1 ||
    { tail -30 "$WORK/ninja.log"; echo "build failed"; exit 1; }
fi
[[ -f $SHIM && -x $REPLAY ]] || { echo "need $SHIM and $REPLAY"; exit 1; }
SHIM=$ROOT/$SHIM
REPLAY=$ROOT/$REPLAY
echo "shim $SHIM; replay $REPLAY"

# --- 2. the programs -------------------------------------------------------------
TORCH_STATS="$OUTDIR/torch-stats.jsonl"
: >"$TORCH_STATS"
run_logged() {  # LOG cmd... (env already set by the caller); prints the tail
  local log=$1 rc
  shift
  timeout --kill-after=10 "$RUN_TIMEOUT" "$@" >"$log" 2>&1
  rc=$?
  grep -E '^(STEP_MS|PEAK|TORCH_MEMORY_STATS)|SKIP|Error|error' "$log" | cut -c1-240 | tail -6
  echo "  -> exit $rc ($(basename "$log"))"
  return $rc
}
for name in $PROGRAMS; do
  args=$(program_args "$name") || { echo "unknown program $name"; continue; }
  banner "$name: under cachalloc, recording (trace + stats)"
  # shellcheck disable=SC2086
  LD_PRELOAD="$SHIM${LD_PRELOAD:+:$LD_PRELOAD}" PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
    CACHALLOC_CONF="trace:$WORK/traces/$name-%p.json,trace_max_entries:$TRACE_MAX_ENTRIES,stats:$OUTDIR/stats/$name-%p.stats.json" \
    run_logged "$OUTDIR/logs/$name.cachalloc.log" "$PY" bench/programs/mem_stats.py --name "$name" --setting cachalloc -- $args
  [[ $? == 77 ]] && { echo "$name skipped (see its log)"; continue; }
  for i in "${!NATIVE_LABELS[@]}"; do
    label=${NATIVE_LABELS[$i]} conf=${NATIVE_CONFS[$i]}
    banner "$name: PyTorch's allocator, PYTORCH_CUDA_ALLOC_CONF='$conf'"
    log="$OUTDIR/logs/$name.native$i.log"
    # shellcheck disable=SC2086
    PYTORCH_CUDA_ALLOC_CONF="$conf" \
      run_logged "$log" "$PY" bench/programs/mem_stats.py --name "$name" --setting "$label" -- $args
    grep '^TORCH_MEMORY_STATS ' "$log" >>"$TORCH_STATS"
  done
done

# --- 3. replay ----------------------------------------------------------------------
banner "traces"
shopt -s nullglob
traces=("$WORK"/traces/*.json)
if ((${#traces[@]} == 0)); then echo "no trace was written"; fi
for t in "${traces[@]}"; do
  base=$(basename "$t" .json)
  compact="$WORK/traces/$base.replay.gz"
  "$REPLAY" --extract "$compact" "$t" || continue
  json_kb=$(( $(stat -c %s "$t") / 1024 ))
  gz_kb=$(( $(stat -c %s "$compact") / 1024 ))
  if (( gz_kb <= MAX_COPY_MB * 1024 )); then
    cp "$compact" "$OUTDIR/traces/"
    echo "$base: trace JSON $json_kb KiB; compact gzip $gz_kb KiB -> OUTDIR/traces/$base.replay.gz"
  else
    echo "$base: trace JSON $json_kb KiB; compact gzip $gz_kb KiB: over MAX_COPY_MB=$MAX_COPY_MB, left out"
  fi
done

banner "replay (trace_replay on the fake backend)"
if ((${#traces[@]} > 0)); then
  "$REPLAY" --json "$OUTDIR/replay.json" "${traces[@]}" >"$OUTDIR/replay.md"
  echo "trace_replay exit $? -> replay.md, replay.json"
  grep -E '^### |INCOMPLETE|skipped|no otherData' "$OUTDIR/replay.md"
fi

banner "report"
"$PY" bench/memory_report.py --replay "$OUTDIR/replay.json" --torch "$TORCH_STATS" \
  --cachalloc-stats "$OUTDIR"/stats/*.stats.json -o "$OUTDIR/memory-report.md" >/dev/null
rm -rf "$WORK"
echo "done in $(elapsed) s; files in $OUTDIR:"
( cd "$OUTDIR" && find . -type f -printf '%p %k KiB\n' | sort )
printf '\n'
cat "$OUTDIR/memory-report.md"
