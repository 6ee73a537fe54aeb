#!/usr/bin/env bash
# multistream_memory.sh — issue 18's memory comparison in one run, on the
# GPU machine, from the repository root after a gpu-check build:
#
#   bench/multistream_memory.sh [ROUNDS]      (default 2)
#
# bench/programs/suite.py (phases train, hf, side: train_varlen, hf_gpt2 and
# train_varlen --side-stream, one process per allocator, the peak reset
# between phases) under each allocator, interleaved round by round:
#   native, native_exp        PyTorch's own allocator, classic / expandable
#   preload, preload_exp      cachalloc by LD_PRELOAD with PyTorch's caching
#                             off (plain cudaFree: fences, joins and the
#                             fence_wait_max_mb bound, default 64)
#   preload_w16, _w256, _wunl the classic preload with fence_wait_max_mb
#                             16, 256, unlimited (joins at misses only): the
#                             memory-against-time curve of the bound
#   async, async_classic      cachalloc --torch-async (expandable segments
#                             by default) and with classic segments
#   cudapool                  CUDA's pool (PyTorch backend:cudaMallocAsync)
# MODES="native preload ..." picks a subset; PHASES (train,hf,side) and
# STEPS (16) shorten a run.  Then examples/multi_stream bare and under
# cachalloc (classic, expandable).  Prints one line per mode, round and
# phase: median step ms, device peak (NVML), the first loss (bit pattern)
# and cachalloc's counters (driver calls per free, fences, joins, host
# waits), then a table of medians over the rounds.
set -u
cd "$(dirname "$0")/.." || exit 1
ROUNDS=${1:-2}
B=${BUILD_DIR:-build-gpu}
S=$PWD/$B/shim/libcachalloc.so
L=$PWD/$B/scripts/cachalloc
MODES=${MODES:-native native_exp preload preload_exp preload_w16 preload_w256 preload_wunl async async_classic cudapool}
PHASES=${PHASES:-train,hf,side}
STEPS=${STEPS:-16}
LOGS=${LOGS:-$(mktemp -d)}
mkdir -p "$LOGS"
pre="LD_PRELOAD=$S PYTORCH_NO_CUDA_MEMORY_CACHING=1"
for round in $(seq "$ROUNDS"); do
  for mode in $MODES; do
    case $mode in
      native) set -- env ;;
      native_exp) set -- env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True ;;
      preload) set -- env $pre ;;
      preload_exp) set -- env $pre CACHALLOC_CONF=expandable_segments:true ;;
      preload_w16) set -- env $pre CACHALLOC_CONF=fence_wait_max_mb:16 ;;
      preload_w256) set -- env $pre CACHALLOC_CONF=fence_wait_max_mb:256 ;;
      preload_wunl) set -- env $pre CACHALLOC_CONF=fence_wait_max_mb:unlimited ;;
      async) set -- "$L" --torch-async -- ;;
      async_classic) set -- "$L" --torch-async --conf expandable_segments:false -- ;;
      cudapool) set -- env PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync ;;
      *) echo "unknown mode $mode" >&2; exit 2 ;;
    esac
    "$@" timeout 240 python3 bench/programs/suite.py --phases "$PHASES" --steps "$STEPS" --warmup 3 --hf-steps 10 \
      >"$LOGS/$mode-$round.log" 2>&1
    echo "suite $mode round $round: exit $?"
  done
done
python3 - "$LOGS"/*.log <<'PY'
import collections, json, statistics, sys
rows = collections.defaultdict(list)
for path in sys.argv[1:]:
    stem = path.rsplit("/", 1)[-1][:-4]
    mode, rnd = stem.rsplit("-", 1)
    for line in open(path):
        if not line.startswith("RESULT "):
            continue
        r = json.loads(line[7:])
        if r.get("skipped") or not r.get("step_ms"):
            continue
        c = r.get("cachalloc", {}) or {}
        f = c.get("fences", {}) or {}
        rec = dict(step=statistics.median(r["step_ms"]), peak=(r["peak"]["bytes"] or 0) / 2**30, loss0=r["losses"][0],
                   lossN=r["losses"][-1], calls=c.get("driver_calls_per_free"), fences=f.get("num_fences"),
                   joins=f.get("num_fence_joins"), waits=f.get("num_fence_waits"))
        rows[(r["program"], mode)].append(rec)
        print("%-14s %-14s round %s step_ms=%.2f peak_GiB=%.3f loss0=%s lossN=%s calls/free=%s fences=%s joins=%s waits=%s" % (
            r["program"], mode, rnd, rec["step"], rec["peak"], rec["loss0"], rec["lossN"], rec["calls"], rec["fences"],
            rec["joins"], rec["waits"]))
print("\nTABLE program | mode | peak GiB (median; range) | step ms (median; range) | calls/free | joins | last loss same as native")
for (prog, mode), recs in sorted(rows.items()):
    native = rows.get((prog, "native"), [{}])[0].get("lossN")
    peaks = [x["peak"] for x in recs]
    steps = [x["step"] for x in recs]
    same = all(x["lossN"] == native for x in recs) if native else "?"
    print("TABLE %s | %s | %.3f (%.3f-%.3f) | %.2f (%.2f-%.2f) | %s | %s | %s" % (
        prog, mode, statistics.median(peaks), min(peaks), max(peaks), statistics.median(steps), min(steps), max(steps),
        recs[-1]["calls"], recs[-1]["joins"], same))
PY
for conf in bare "" expandable_segments:true; do
  if [[ $conf == bare ]]; then p=""; else p=$S; fi
  echo "multi_stream [${conf:-cachalloc classic}]: $(CACHALLOC_CONF=$conf LD_PRELOAD=$p "$B/examples/multi_stream_static" --iters 3000 2>&1 | grep '^RESULT')"
done
