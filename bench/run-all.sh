#!/usr/bin/env bash
# run-all.sh — every contender of issue 8 built and measured in ONE invocation,
# on the GPU machine, from the repository root:
#
#   bench/run-all.sh            # default: 6 minutes at most on one H100 (9 with 2 GPUs: DDP)
#   bench/run-all.sh --quick    # 2 minutes at most (fewer cases, programs: 2 allocators;
#                               # a fresh build-gpu adds about a minute of compiling)
#
# Sections, each timed and each catching its own failures (what failed and
# why is printed, the next section runs):
#   build     meson setup/reconfigure of $BUILD_DIR (default build-gpu, the one
#             scripts/gpu-check.sh uses; deps from .deps as gpu-check does),
#             then only the targets needed: shim/libcachalloc.so,
#             bench/alloc_bench_{static,shared} (nvcc), bench/floor_preload.so;
#             at the same time bench/torch_alloc_bench.cpp is compiled against
#             the installed torch (c10, c10_cuda; rpath set).  Without meson the
#             benchmark binaries are compiled directly (cachalloc then missing).
#   micro     bench/run_bench.py: bare driver, CUDA's pool, the floor
#             (bench/floor_preload.c), PyTorch's allocator from C++, cachalloc
#             (LD_PRELOAD into the same alloc_bench binary), interleaved round by
#             round: pair latency at 512 B, 1 MiB, 64 MiB, with a blocking and a
#             non-blocking stream alive, async pair, churn, cost against 10^2 to
#             10^6 live blocks, aggregate throughput at 1-16 threads.
#   counters  cachalloc again with stats:PATH: driver calls per free.
#   programs  bench/programs/suite.py (transformer with varying shapes, HF GPT-2,
#             the transformer with a side stream) under PyTorch's allocator,
#             cachalloc, and both with expandable segments, interleaved; DDP
#             with NCCL on two GPUs when there are two.
#   report    bench/report.py: markdown tables with medians, spreads and ratios,
#             the issue-8 targets marked met/missed, PNG plots.
#
# Output: bench/results/<date>-<host>.{md,json}, <stem>-docs.md (the section
# for docs/BENCHMARKS.md), <stem>-threads.png, <stem>-live.png, <stem>.log;
# also copied to $OUT when that is set (the device tool brings $OUT back).
#
# Options / environment:
#   --quick                  quick preset (BENCH_QUICK=1)
#   --seconds N              total time budget, build included (BENCH_SECONDS;
#                            default 360 with one GPU, 540 with two, 120 quick);
#                            sections stop at a round boundary when it runs out
#   --rounds N               micro rounds (default 5); --program-rounds N (default 5)
#   --sections LIST          subset of micro,counters,programs (default all)
#   --skip-build             use what $BUILD_DIR already has
#   --no-ddp                 leave DDP out even with two GPUs
#   --ddp-only               programs: DDP only (the 2-GPU machine's part of a
#                            run whose one-GPU part ran on another machine)
#   --configs LIST           program allocators (default native,cachalloc,
#                            native_expandable,cachalloc_expandable; also
#                            cachalloc_pluggable, cudapool, cachalloc_async,
#                            cachalloc_w256, cachalloc_expandable_w256:
#                            bench/run_bench.py's CONFIG_ENV)
#   --phases LIST            suite.py's phases (default train,hf,side)
#   --pin CPUS               programs: every program process on these CPUs
#                            only (taskset list, e.g. 2-5), the same for every
#                            contender; step time then varies less between
#                            processes (docs/BENCHMARKS.md §5)
#   --dry-run                no GPU needed: the harness on host malloc and a fake
#                            program (checks the script itself; figures meaningless)
#   BUILD_DIR (build-gpu), JOBS (nproc), BENCH_PYTHON (python3),
#   BENCH_CACHALLOC_CONFS    extra cachalloc contenders, ';'-separated
#                            CACHALLOC_CONF values, e.g. "free_sync:stream"
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
source scripts/gpu-build.sh
START=$(date +%s)
QUICK=${BENCH_QUICK:-0}
SECONDS_WANTED=${BENCH_SECONDS:-}
ROUNDS=${BENCH_ROUNDS:-}
PROGRAM_ROUNDS=""
SECTIONS=micro,counters,programs
SKIP_BUILD=0
NO_DDP=0
DDP_ONLY=0
CONFIGS=""
PHASES=""
PIN=""
DRY=0
ARGS="$*"
while (($#)); do
  case $1 in
    --quick) QUICK=1 ;;
    --seconds) SECONDS_WANTED=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    --program-rounds) PROGRAM_ROUNDS=$2; shift ;;
    --sections) SECTIONS=$2; shift ;;
    --skip-build) SKIP_BUILD=1 ;;
    --no-ddp) NO_DDP=1 ;;
    --ddp-only) DDP_ONLY=1 ;;
    --configs) CONFIGS=$2; shift ;;
    --phases) PHASES=$2; shift ;;
    --pin) PIN=$2; shift ;;
    --dry-run) DRY=1 ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed 's/^# \{0,1\}//; /^set -u/d'; exit 0 ;;
    *) echo "run-all.sh: unknown argument $1 (--help)"; exit 2 ;;
  esac
  shift
done
BUILD=${BUILD_DIR:-build-gpu}
JOBS=${JOBS:-$(nproc)}
PY=${BENCH_PYTHON:-python3}
RESULTS=$ROOT/bench/results
mkdir -p "$RESULTS"
STEM="$(date -u +%Y-%m-%d-%H%M)-$(hostname -s 2>/dev/null || hostname)"
((DRY)) && STEM="$STEM-dryrun"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/run-all.XXXXXX")
LOG="$RESULTS/$STEM.log"
exec > >(tee "$LOG") 2>&1

elapsed() { echo $(( $(date +%s) - START )); }
SECTION_T0=0
section() { SECTION_T0=$(date +%s); printf '\n===== [t=%ss] %s\n' "$(elapsed)" "$1"; }
section_done() { printf -- '----- %s: %s, %s s (t=%ss)\n' "$1" "$2" "$(( $(date +%s) - SECTION_T0 ))" "$(elapsed)"; }

# --- the machine ---------------------------------------------------------------------
section "machine"
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
GPUS=0
if ((! DRY)) && command -v nvidia-smi >/dev/null 2>&1; then
  GPUS=$(timeout 30 nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
fi
((DRY)) && GPUS=1
if ((GPUS == 0)); then
  echo "run-all.sh: no GPU found (nvidia-smi -L lists none): nothing can be measured here."
  echo "            (bench/run-all.sh --dry-run checks the harness itself without a GPU)"
fi
if [[ -z $SECONDS_WANTED ]]; then
  if ((QUICK)); then SECONDS_WANTED=120; elif ((GPUS >= 2 && ! NO_DDP)); then SECONDS_WANTED=540; else SECONDS_WANTED=360; fi
fi
DEADLINE=$(( START + SECONDS_WANTED ))
PRESET=default; ((QUICK)) && PRESET=quick; ((DRY)) && PRESET=tiny
echo "budget ${SECONDS_WANTED} s (until $(date -d "@$DEADLINE" +%T 2>/dev/null || echo "+$SECONDS_WANTED s")), preset $PRESET, $GPUS GPU(s), build dir $BUILD, -j$JOBS"
for tool in nvcc g++ meson ninja "$PY"; do
  printf '%-8s %s\n' "$tool" "$( (command -v "$tool" >/dev/null && "$tool" --version 2>&1 | grep -m1 -iE 'release|[0-9]+\.[0-9]+') || echo 'not found')"
done
TORCH_VERSION="" TRANSFORMERS_VERSION=""
PYINFO=$(timeout 120 "$PY" - <<'PY' 2>&1
import importlib
for name in ("torch", "transformers", "matplotlib", "pynvml"):
    try:
        m = importlib.import_module(name)
        print(f"{name} {getattr(m, '__version__', '?')}")
    except Exception as e:
        print(f"{name} - ({type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''})")
PY
)
echo "$PYINFO" | sed 's/^/python   /'
TORCH_VERSION=$(echo "$PYINFO" | awk '$1=="torch" && $2!="-" {print $2}')
TRANSFORMERS_VERSION=$(echo "$PYINFO" | awk '$1=="transformers" && $2!="-" {print $2}')
[[ -z $TRANSFORMERS_VERSION ]] && echo "transformers is not importable: the HuggingFace program will be skipped (its row says why)"
GIT_DESC=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "unknown (no .git)")
if git -C "$ROOT" rev-parse HEAD >/dev/null 2>&1; then
  n=$(git -C "$ROOT" status --porcelain 2>/dev/null | wc -l)
  ((n > 0)) && GIT_DESC="$GIT_DESC + $n uncommitted changes"
fi
section_done machine ok

# --- build -------------------------------------------------------------------------------
section "build"
BUILD_ERRORS=()
SHIM="" FLOOR="" CALL_TIMER="" BENCH_STATIC="" BENCH_SHARED="" TORCH_BENCH=""
CUDA_HOME_GUESS=$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")
CUDA_INC="$CUDA_HOME_GUESS/include"
CUDA_LIB="$CUDA_HOME_GUESS/lib64"
NVCC_ARGS=(-O2 -std=c++17 -Xcompiler -Wall -gencode 'arch=compute_90,code=[sm_90,compute_90]')
FALLBACK_BIN="$WORK/bin"
mkdir -p "$FALLBACK_BIN"

# PyTorch's allocator from C++, against the torch installed here (background).
build_torch_bench() {
  local out=$1 info torch_dir abi cudart
  info=$(timeout 120 "$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__)); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>&1) ||
    { echo "torch is not importable: $info"; return 1; }
  torch_dir=$(echo "$info" | sed -n 1p)
  abi=$(echo "$info" | sed -n 2p)
  [[ -f $torch_dir/include/c10/cuda/CUDACachingAllocator.h ]] || { echo "no c10 headers under $torch_dir/include"; return 1; }
  # Link the libcudart that libc10_cuda itself loads (torch's wheel ships its own).
  cudart=$(ldd "$torch_dir/lib/libc10_cuda.so" 2>/dev/null | awk '/libcudart/ {print $3; exit}')
  [[ -f $cudart ]] || cudart="$CUDA_LIB/libcudart.so"
  echo "torch at $torch_dir (cxx11 abi $abi), cudart $cudart"
  for std in c++20 c++17; do
    if g++ -O2 -std=$std -D_GLIBCXX_USE_CXX11_ABI="$abi" -I"$torch_dir/include" -I"$CUDA_INC" -pthread \
        "$ROOT/bench/torch_alloc_bench.cpp" -o "$out" -L"$torch_dir/lib" -lc10_cuda -lc10 "$cudart" \
        -Wl,-rpath,"$torch_dir/lib:$(dirname "$cudart")" -Wl,-rpath-link,"$torch_dir/lib:$(dirname "$cudart")"; then
      echo "built $out (-std=$std)"
      return 0
    fi
    echo "(-std=$std failed)"
  done
  return 1
}

if ((DRY)); then
  g++ -O2 -std=c++17 -pthread bench/alloc_host.cpp -o "$FALLBACK_BIN/alloc_host" &&
    BENCH_STATIC="$FALLBACK_BIN/alloc_host" BENCH_SHARED="$FALLBACK_BIN/alloc_host" TORCH_BENCH="$FALLBACK_BIN/alloc_host" \
    SHIM=dry FLOOR=dry || BUILD_ERRORS+=("alloc_host did not build")
else
  TORCH_OUT="$BUILD/bench-torch/torch_alloc_bench"
  mkdir -p "$(dirname "$TORCH_OUT")"
  if ((SKIP_BUILD)); then
    [[ -x $TORCH_OUT ]] || echo "--skip-build: no $TORCH_OUT"
  else
    (build_torch_bench "$TORCH_OUT" >"$WORK/torch-build.log" 2>&1; echo $? >"$WORK/torch-build.rc") &
    TORCH_PID=$!
    gpu_setup_args
    configure_build "$BUILD" "$WORK/configure.log"
    rc=$?
    if ((rc != 0)); then
      BUILD_ERRORS+=("meson setup failed (exit $rc): $(grep -m1 -E 'ERROR' "$WORK/configure.log" | cut -c1-200)")
      tail -5 "$WORK/configure.log"
    else
      # (python-package: build/python/cachalloc/ whole, which the pluggable
      # contender imports; without it only __init__.py is there)
      targets=(shim/libcachalloc.so bench/alloc_bench_static bench/alloc_bench_shared bench/floor_preload.so
               bench/call_timer.so python-package)
      echo "ninja -C $BUILD -k 0 ${targets[*]}"
      timeout 600 ninja -C "$BUILD" -k 0 -j "$JOBS" "${targets[@]}" >"$WORK/ninja.log" 2>&1
      rc=$?
      ((rc != 0)) && { BUILD_ERRORS+=("ninja exit $rc: $(grep -m3 -E 'FAILED|error' "$WORK/ninja.log" | cut -c1-160 | paste -sd' ' -)"); tail -20 "$WORK/ninja.log"; }
    fi
  fi
  [[ -f "$BUILD/shim/libcachalloc.so" ]] && SHIM="$ROOT/$BUILD/shim/libcachalloc.so"
  [[ -x "$BUILD/bench/alloc_bench_static" ]] && BENCH_STATIC="$ROOT/$BUILD/bench/alloc_bench_static"
  [[ -x "$BUILD/bench/alloc_bench_shared" ]] && BENCH_SHARED="$ROOT/$BUILD/bench/alloc_bench_shared"
  [[ -f "$BUILD/bench/floor_preload.so" ]] && FLOOR="$ROOT/$BUILD/bench/floor_preload.so"
  [[ -f "$BUILD/bench/call_timer.so" ]] && CALL_TIMER="$ROOT/$BUILD/bench/call_timer.so"
  # The package the pluggable contender imports must import whole (a run lost
  # every pluggable row to a module the build had not copied).
  if [[ -f "$BUILD/python/cachalloc/__init__.py" ]] &&
     ! err=$(PYTHONPATH="$ROOT/$BUILD/python" CACHALLOC_LIBRARY=/nonexistent "$PY" -c 'import cachalloc' 2>&1); then
    BUILD_ERRORS+=("$BUILD/python/cachalloc does not import: $(tail -1 <<<"$err" | cut -c1-160)")
  fi
  # Whatever meson did not give us is compiled directly (it does not need the core).
  if [[ -z $BENCH_STATIC || -z $BENCH_SHARED ]] && command -v nvcc >/dev/null 2>&1; then
    echo "alloc_bench from meson missing: compiling it with nvcc directly"
    nvcc "${NVCC_ARGS[@]}" -o "$FALLBACK_BIN/alloc_bench_static" bench/alloc_bench.cu >>"$WORK/fallback.log" 2>&1 &&
      BENCH_STATIC="$FALLBACK_BIN/alloc_bench_static"
    nvcc "${NVCC_ARGS[@]}" -cudart shared -Xlinker -rpath -Xlinker "$CUDA_LIB" -o "$FALLBACK_BIN/alloc_bench_shared" \
      bench/alloc_bench.cu >>"$WORK/fallback.log" 2>&1 && BENCH_SHARED="$FALLBACK_BIN/alloc_bench_shared"
  fi
  if [[ -z $FLOOR ]]; then
    gcc -O2 -std=c11 -fPIC -shared -fvisibility=hidden -I"$CUDA_INC" bench/floor_preload.c -o "$FALLBACK_BIN/floor_preload.so" -ldl \
      >>"$WORK/fallback.log" 2>&1 && FLOOR="$FALLBACK_BIN/floor_preload.so"
  fi
  if [[ -z $CALL_TIMER ]]; then
    gcc -O2 -std=c11 -fPIC -shared -fvisibility=hidden -I"$CUDA_INC" bench/call_timer.c -o "$FALLBACK_BIN/call_timer.so" -ldl \
      >>"$WORK/fallback.log" 2>&1 && CALL_TIMER="$FALLBACK_BIN/call_timer.so"
  fi
  [[ -s "$WORK/fallback.log" ]] && tail -10 "$WORK/fallback.log"
  if [[ -n ${TORCH_PID:-} ]]; then
    wait "$TORCH_PID"
    cat "$WORK/torch-build.log"
    [[ $(cat "$WORK/torch-build.rc" 2>/dev/null) == 0 ]] ||
      BUILD_ERRORS+=("PyTorch contender not built: $(grep -m2 -E 'error|not importable|no c10' "$WORK/torch-build.log" | cut -c1-200 | paste -sd' ' -)")
  fi
  [[ -x $TORCH_OUT ]] && TORCH_BENCH="$ROOT/$TORCH_OUT"
  ((SKIP_BUILD)) && [[ -z $TORCH_BENCH ]] && BUILD_ERRORS+=("PyTorch contender missing (--skip-build and no $TORCH_OUT)")
fi
[[ -z $SHIM ]] && BUILD_ERRORS+=("libcachalloc.so not built: the cachalloc contender is left out")
[[ -z $BENCH_STATIC ]] && BUILD_ERRORS+=("alloc_bench_static not built: no micro benchmark")
[[ -z $FLOOR ]] && BUILD_ERRORS+=("floor_preload.so not built: no floor")
echo "shim:         ${SHIM:-MISSING}"
echo "alloc_bench:  ${BENCH_STATIC:-MISSING} / ${BENCH_SHARED:-MISSING}"
echo "floor:        ${FLOOR:-MISSING}"
echo "call timer:   ${CALL_TIMER:-MISSING} (CUDA's pool's time per call in the programs)"
echo "torch bench:  ${TORCH_BENCH:-MISSING}"
for e in "${BUILD_ERRORS[@]}"; do echo "build problem: $e"; done
BUILD_STATUS=ok; ((${#BUILD_ERRORS[@]})) && BUILD_STATUS=partial
"$PY" - "$WORK/build.json" "$(( $(date +%s) - SECTION_T0 ))" "$BUILD_STATUS" "${BUILD_ERRORS[@]}" <<'PY'
import json, sys
path, secs, status, errors = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4:]
json.dump({"section": {"name": "build", "elapsed_s": secs, "status": status},
           "errors": [f"build: {e}" for e in errors]}, open(path, "w"))
PY
section_done build "$BUILD_STATUS"

# --- measure -----------------------------------------------------------------------------
section "measure (micro, counters, programs; bench/run_bench.py)"
RAW="$RESULTS/$STEM.json"
if ((GPUS == 0)); then
  echo "no GPU: measurement skipped"
  "$PY" - "$RAW" "$WORK/build.json" <<'PY'
import json, sys
b = json.load(open(sys.argv[2]))
json.dump({"schema": 1, "meta": {"note": "no GPU: nothing measured"}, "preset": {}, "sections": [b["section"]],
           "errors": b["errors"] + ["no GPU: nothing measured"], "micro": {"samples": [], "notes": []},
           "counters": {"groups": [], "notes": []}, "programs": {"runs": [], "notes": []}}, open(sys.argv[1], "w"))
PY
else
  measure_args=(--out "$RAW" --work "$WORK/measure" --preset "$PRESET" --deadline $(( DEADLINE - 8 ))
                --sections "$SECTIONS" --gpus "$GPUS" --python "$PY" --build-status "$WORK/build.json"
                --meta "git=$GIT_DESC" --meta "run_all_command=bench/run-all.sh${ARGS:+ $ARGS}")
  [[ -n $TORCH_VERSION ]] && measure_args+=(--meta "torch_version=$TORCH_VERSION")
  [[ -n $TRANSFORMERS_VERSION ]] && measure_args+=(--meta "transformers=$TRANSFORMERS_VERSION")
  [[ -n $BENCH_STATIC ]] && measure_args+=(--bench-static "$BENCH_STATIC")
  [[ -n $BENCH_SHARED ]] && measure_args+=(--bench-shared "$BENCH_SHARED")
  [[ -n $TORCH_BENCH ]] && measure_args+=(--torch-bench "$TORCH_BENCH")
  [[ -n $FLOOR ]] && measure_args+=(--floor "$FLOOR")
  [[ -n $CALL_TIMER ]] && measure_args+=(--call-timer "$CALL_TIMER")
  [[ -n $SHIM ]] && measure_args+=(--shim "$SHIM")
  [[ -n $ROUNDS ]] && measure_args+=(--rounds "$ROUNDS")
  [[ -n $PROGRAM_ROUNDS ]] && measure_args+=(--program-rounds "$PROGRAM_ROUNDS")
  ((NO_DDP)) && measure_args+=(--no-ddp)
  ((DDP_ONLY)) && measure_args+=(--ddp-only)
  [[ -n $CONFIGS ]] && measure_args+=(--configs "$CONFIGS")
  [[ -n $PHASES ]] && measure_args+=(--phases "$PHASES")
  [[ -n $PIN ]] && measure_args+=(--pin "$PIN")
  ((DRY)) && measure_args+=(--dry-run)
  left=$(( DEADLINE - $(date +%s) ))
  ((left < 30)) && left=30
  timeout --kill-after=10 $(( left + 60 )) "$PY" bench/run_bench.py "${measure_args[@]}"
  rc=$?
  ((rc != 0)) && echo "run_bench.py exit $rc$( ((rc == 124)) && echo ' (timed out)'): the report uses what it wrote"
fi
section_done measure "$( [[ -s $RAW ]] && echo ok || echo failed)"

# --- report ------------------------------------------------------------------------------
section "report (bench/report.py)"
if [[ -s $RAW ]]; then
  "$PY" - "$RAW" "$(elapsed)" <<'PY'
import json, sys
raw = json.load(open(sys.argv[1]))
raw.setdefault("meta", {})["total_seconds"] = sys.argv[2]
json.dump(raw, open(sys.argv[1], "w"), indent=1, sort_keys=True)
PY
  "$PY" bench/report.py "$RAW" --md "$RESULTS/$STEM.md" --plots-dir "$RESULTS" --stem "$STEM" \
    --summary-json "$WORK/summary.json" || echo "report.py failed (exit $?)"
  "$PY" bench/report.py "$RAW" --markdown-for-docs --stem "$STEM" >"$RESULTS/$STEM-docs.md" 2>/dev/null ||
    echo "report.py --markdown-for-docs failed"
  echo
  echo "results: $RESULTS/$STEM.md (full report), $STEM.json (raw), $STEM-docs.md (docs/BENCHMARKS.md section),"
  echo "         $(cd "$RESULTS" && ls "$STEM"-*.png 2>/dev/null | paste -sd' ' -)"
else
  echo "no raw data: nothing to report"
fi
section_done report "$( [[ -s $RESULTS/$STEM.md ]] && echo ok || echo failed)"
printf '\nrun-all.sh: %s s in all (budget %s s)\n' "$(elapsed)" "$SECONDS_WANTED"
if [[ -n ${OUT:-} ]]; then
  mkdir -p "$OUT"
  cp "$RESULTS/$STEM".* "$RESULTS/$STEM"-* "$OUT/" 2>/dev/null
  tar -czf "$OUT/$STEM-work.tar.gz" -C "$WORK" . 2>/dev/null
fi
rm -rf "$WORK"
exit 0
