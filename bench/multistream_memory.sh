#!/usr/bin/env bash
# multistream_memory.sh — issue 18's side-stream comparison in one run, on
# the GPU machine, from the repository root after a gpu-check build:
#
#   bench/multistream_memory.sh [ROUNDS]      (default 2; ~12 s per program run)
#
# train_varlen.py --side-stream (a non-blocking prefetch/reduction stream)
# under each allocator, interleaved round by round: PyTorch's own allocator
# (classic, expandable), cachalloc by LD_PRELOAD with PyTorch's caching off
# (classic, expandable: plain cudaFree, fences and joins), the cudaMallocAsync
# route through the launcher (cachalloc --torch-async, classic and
# expandable), and CUDA's own pool (PyTorch's cudaMallocAsync backend, no
# cachalloc).  Then examples/multi_stream bare and under cachalloc (classic,
# expandable).  Prints one line per run: median step ms, device peak (NVML),
# the first loss (bit pattern) and cachalloc's counters (driver calls per
# free, fences, joins, host waits).
set -u
cd "$(dirname "$0")/.." || exit 1
ROUNDS=${1:-2}
B=${BUILD_DIR:-build-gpu}
S=$PWD/$B/shim/libcachalloc.so
L=$PWD/$B/scripts/cachalloc
LOGS=$(mktemp -d)
for round in $(seq "$ROUNDS"); do
  for mode in native native_exp preload preload_exp async async_exp cudapool; do
    case $mode in
      native) set -- env ;;
      native_exp) set -- env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True ;;
      preload) set -- env LD_PRELOAD="$S" PYTORCH_NO_CUDA_MEMORY_CACHING=1 ;;
      preload_exp) set -- env LD_PRELOAD="$S" PYTORCH_NO_CUDA_MEMORY_CACHING=1 CACHALLOC_CONF=expandable_segments:true ;;
      async) set -- "$L" --torch-async -- ;;
      async_exp) set -- "$L" --torch-async --conf expandable_segments:true -- ;;
      cudapool) set -- env PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync ;;
    esac
    "$@" timeout 150 python3 bench/programs/train_varlen.py --side-stream >"$LOGS/$mode-$round.log" 2>&1
    echo "train_varlen_side $mode round $round: exit $?"
  done
done
python3 - "$LOGS"/*.log <<'PY'
import json, statistics, sys
for path in sys.argv[1:]:
    for line in open(path):
        if not line.startswith("RESULT "):
            continue
        r = json.loads(line[7:])
        c = r.get("cachalloc", {}) or {}
        f = c.get("fences", {}) or {}
        extra = ""
        if c:
            extra = " calls/free=%.4f fences=%s joins=%s host_waits=%s" % (
                c.get("driver_calls_per_free") or 0, f.get("num_fences"), f.get("num_fence_joins"), f.get("num_fence_waits"))
        print("%-22s step_ms_median=%.2f peak_GiB=%.3f loss0=%s%s" % (
            path.rsplit("/", 1)[-1][:-4], statistics.median(r["step_ms"]), (r["peak"]["bytes"] or 0) / 2**30,
            r["losses"][0], extra))
PY
for conf in bare "" expandable_segments:true; do
  if [[ $conf == bare ]]; then pre=""; else pre=$S; fi
  echo "multi_stream [${conf:-cachalloc classic}]: $(CACHALLOC_CONF=$conf LD_PRELOAD=$pre "$B/examples/multi_stream_static" --iters 3000 2>&1 | grep '^RESULT')"
done
