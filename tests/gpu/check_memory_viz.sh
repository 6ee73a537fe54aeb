#!/usr/bin/env bash
# check_memory_viz.sh — on the GPU machine: does PyTorch's own memory_viz
# open what `cachalloc-report viz` writes?  From the repository root, after a
# build (scripts/gpu-check.sh builds build-gpu):
#
#   tests/gpu/check_memory_viz.sh
#
# 1. A small PyTorch program (tensors of several sizes, a few training steps,
#    a tensor freed while a side stream still uses it (record_stream), an
#    out-of-memory; on every GPU when there are two or more) runs under
#    cachalloc: LD_PRELOAD=libcachalloc.so, PYTORCH_NO_CUDA_MEMORY_CACHING=1,
#    CACHALLOC_CONF=snapshot:...,trace:...,stats:...; once with classic
#    segments, once with expandable_segments:true.
# 2. `scripts/cachalloc-report viz` converts each run's snapshot and trace.
# 3. `python -m torch.cuda._memory_viz trace_plot` and `segment_plot` (and
#    `stats`, `trace`) run on each pickle; the HTML files must be written and
#    embed the snapshot; tests/integration/check_memory_viz.py --torch require
#    checks structure, faithfulness to the JSON reports, MemoryViz.js's
#    invariants, and calls _memory_viz's functions.
# 4. The same program runs bare with PyTorch's own caching allocator,
#    torch.cuda.memory._record_memory_history() and _dump_snapshot(): the key
#    sets (top level, segments, blocks, trace entries per action,
#    allocator_settings) and value types of the native pickle and of ours are
#    compared; a key the native pickle has and ours lacks is a failure, a key
#    only ours has is listed.
#
# Environment: BUILD_DIR (default build-gpu; libcachalloc.so is looked for
# under it as scripts/gpu-check.sh does), OUT (default ./memory-viz-out:
# pickles, JSON reports, HTML, key comparison, log).  Exit 0 pass, 1 fail,
# 77 skip (no GPU, or no torch with CUDA).
set -u
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
BUILD=${BUILD_DIR:-build-gpu}
OUTDIR=${OUT:-$ROOT/memory-viz-out}
mkdir -p "$OUTDIR"
exec > >(tee "$OUTDIR/check_memory_viz.log") 2>&1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/memory-viz.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
REPORT="$ROOT/scripts/cachalloc-report"
CHECKER="$ROOT/tests/integration/check_memory_viz.py"
RESULTS=()
status=0
result() {  # result NAME PASS|FAIL|SKIP DETAIL
  RESULTS+=("$(printf '%-38s %-5s %s' "$1" "$2" "$3")")
  [[ $2 == FAIL ]] && status=1
}
finish() {
  echo
  echo "===== memory_viz check"
  printf '%s\n' "${RESULTS[@]}"
  echo "artefacts: $OUTDIR"
  exit "$1"
}

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "SKIP: no GPU here (nvidia-smi absent or failing)"
  exit 77
fi
if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "SKIP: torch with CUDA is not importable"
  exit 77
fi
SHIM=$(find "$BUILD" -name 'libcachalloc.so' \( -type f -o -type l \) 2>/dev/null | head -1)
if [[ -z $SHIM ]]; then
  echo "FAIL: no libcachalloc.so under $BUILD (build first: scripts/gpu-check.sh, or meson setup $BUILD && ninja -C $BUILD)"
  exit 1
fi
SHIM=$(realpath "$SHIM")
TORCH_VERSION=$(python3 -c 'import torch; print(torch.__version__)')
NGPU=$(python3 -c 'import torch; print(torch.cuda.device_count())')
echo "torch $TORCH_VERSION, $NGPU GPU(s), shim $SHIM"

# --- the workload --------------------------------------------------------------
cat >"$WORK/viz_workload.py" <<'PY'
"""viz_workload.py MODE [PICKLE]: MODE native records PyTorch's own history
and dumps its snapshot to PICKLE; MODE cachalloc runs the same work (under
cachalloc, with PyTorch's cache off)."""
import sys

import torch

mode = sys.argv[1]
if mode == "native":
    torch.cuda.memory._record_memory_history(max_entries=100000)


def work(dev):
    torch.manual_seed(0)
    keep = [torch.empty(n, device=dev) for n in (100, 1000, 10_000, 1_000_000, 4_000_000)]
    del keep[1], keep[2]
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        loss = model(torch.randn(256, 512, device=dev)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    side = torch.cuda.Stream(dev)
    y = torch.ones(2_000_000, device=dev)
    with torch.cuda.stream(side):
        z = y * 2
    y.record_stream(side)
    del y  # PyTorch's allocator: a free waiting for the side stream
    try:
        torch.empty(1 << 40, dtype=torch.uint8, device=dev)
        raise SystemExit("viz_workload: 1 TiB did not fail")
    except RuntimeError:  # torch.OutOfMemoryError, or the uncached allocator's CUDA error
        pass
    return model, keep, z, side


kept = [work(f"cuda:{d}") for d in range(min(torch.cuda.device_count(), 2))]
torch.cuda.synchronize()
if mode == "native":
    torch.cuda.memory._dump_snapshot(sys.argv[2])
print(f"viz_workload {mode}: done on {len(kept)} device(s)")
PY
NDEV=$(( NGPU >= 2 ? 2 : 1 ))

# --- 1-3. under cachalloc, converted, opened by _memory_viz ----------------------
for variant in classic expandable; do
  conf="snapshot:$OUTDIR/$variant-snapshot.json,trace:$OUTDIR/$variant-trace.json,stats:$OUTDIR/$variant-stats.json"
  [[ $variant == expandable ]] && conf+=",expandable_segments:true"
  rm -f "$OUTDIR/$variant"-*.json
  echo
  echo "===== $variant: the workload under cachalloc (CACHALLOC_CONF=$conf)"
  timeout --kill-after=10 300 env LD_PRELOAD="$SHIM" PYTORCH_NO_CUDA_MEMORY_CACHING=1 CACHALLOC_CONF="$conf" \
    python3 "$WORK/viz_workload.py" cachalloc
  rc=$?
  if [[ $rc -ne 0 || ! -s $OUTDIR/$variant-snapshot.json || ! -s $OUTDIR/$variant-trace.json ]]; then
    result "$variant: workload" FAIL "exit $rc, or no snapshot/trace written"
    continue
  fi
  result "$variant: workload" PASS "snapshot, trace and stats written"
  pickle="$OUTDIR/$variant.pickle"
  python3 "$REPORT" viz "$OUTDIR/$variant-snapshot.json" --trace "$OUTDIR/$variant-trace.json" \
    --stats "$OUTDIR/$variant-stats.json" -o "$pickle" 2>&1 | tee "$WORK/$variant-viz.txt"
  rc=${PIPESTATUS[0]}
  if [[ $rc -ne 0 ]]; then
    result "$variant: cachalloc-report viz" FAIL "exit status $rc"
    continue
  fi
  if grep -q 'does not end where the snapshot was taken' "$WORK/$variant-viz.txt"; then
    result "$variant: cachalloc-report viz" FAIL "trace and snapshot of one exit judged unaligned"
  fi
  result "$variant: cachalloc-report viz" PASS "$(stat -c %s "$pickle") bytes"
  for cmd in trace_plot segment_plot; do
    html="$OUTDIR/$variant-$cmd.html"
    rm -f "$html"
    python3 -m torch.cuda._memory_viz "$cmd" "$pickle" -o "$html"
    rc=$?
    size=$(stat -c %s "$html" 2>/dev/null || echo 0)
    if [[ $rc -eq 0 && $size -gt 2000 ]] && grep -q 'add_local_files' "$html"; then
      result "$variant: _memory_viz $cmd" PASS "$html, $size bytes"
    else
      result "$variant: _memory_viz $cmd" FAIL "exit $rc, $size bytes"
    fi
  done
  for cmd in stats trace; do
    if python3 -m torch.cuda._memory_viz "$cmd" "$pickle" >"$OUTDIR/$variant-$cmd.txt" 2>&1; then
      result "$variant: _memory_viz $cmd" PASS "$(wc -l <"$OUTDIR/$variant-$cmd.txt") lines"
    else
      result "$variant: _memory_viz $cmd" FAIL "$(tail -1 "$OUTDIR/$variant-$cmd.txt" | cut -c1-80)"
    fi
  done
  expects=(--expect oom)
  [[ $variant == expandable ]] && expects+=(--expect expandable) || expects+=(--expect classic)
  (( NDEV == 2 )) && expects+=(--expect devices=2)
  mkdir -p "$OUTDIR/$variant-checker-html"
  if python3 "$CHECKER" "$pickle" "$OUTDIR/$variant-snapshot.json" "$OUTDIR/$variant-trace.json" \
      "${expects[@]}" --torch require --html-dir "$OUTDIR/$variant-checker-html"; then
    result "$variant: check_memory_viz.py" PASS "${expects[*]}"
  else
    result "$variant: check_memory_viz.py" FAIL "see the log"
  fi
done

# --- 4. PyTorch's own snapshot: key sets and types --------------------------------
echo
echo "===== native: the workload with PyTorch's caching allocator and _record_memory_history"
native="$OUTDIR/native.pickle"
rm -f "$native"
timeout --kill-after=10 300 env -u LD_PRELOAD -u PYTORCH_NO_CUDA_MEMORY_CACHING -u CACHALLOC_CONF \
  python3 "$WORK/viz_workload.py" native "$native"
rc=$?
if [[ $rc -ne 0 || ! -s $native ]]; then
  result "native snapshot" FAIL "exit $rc"
  finish 1
fi
result "native snapshot" PASS "$(stat -c %s "$native") bytes"
python3 -m torch.cuda._memory_viz trace_plot "$native" -o "$OUTDIR/native-trace_plot.html" >/dev/null 2>&1 || true
for variant in classic expandable; do
  [[ -s $OUTDIR/$variant.pickle ]] || continue
  python3 - "$native" "$OUTDIR/$variant.pickle" "$NDEV" >"$OUTDIR/$variant-keys.txt" 2>&1 <<'PY'
import pickle
import sys

native = pickle.load(open(sys.argv[1], "rb"))
ours = pickle.load(open(sys.argv[2], "rb"))
ndev = int(sys.argv[3])
missing, extra, types = [], [], []


def tname(v):
    return type(v).__name__


def shape(dicts):
    """{key: {type names}} over a list of dicts."""
    out = {}
    for d in dicts:
        for k, v in d.items():
            out.setdefault(k, set()).add(tname(v))
    return out


def compare(level, theirs, mine):
    if not theirs:
        print(f"{level}: none in the native snapshot, not compared")
        return
    if not mine:
        print(f"{level}: none in ours, not compared")
        return
    t, m = shape(theirs), shape(mine)
    for k in sorted(set(t) - set(m)):
        missing.append(f"{level}.{k}")
    for k in sorted(set(m) - set(t)):
        extra.append(f"{level}.{k}")
    for k in sorted(set(t) & set(m)):
        if not m[k] <= t[k] and not ({"int", "float"} >= m[k] | t[k]):
            types.append(f"{level}.{k}: native {sorted(t[k])}, ours {sorted(m[k])}")
    print(f"{level}: native keys {sorted(t)}")
    print(f"{level}: our keys    {sorted(m)}")


compare("snapshot", [native], [ours])
compare("segment", native["segments"], ours["segments"])
compare("block", [b for s in native["segments"] for b in s["blocks"]], [b for s in ours["segments"] for b in s["blocks"]])
n_entries = [e for t in native["device_traces"] for e in t]
o_entries = [e for t in ours["device_traces"] for e in t]
for action in sorted({e["action"] for e in n_entries} | {e["action"] for e in o_entries}):
    compare(f"trace[{action}]", [e for e in n_entries if e["action"] == action],
            [e for e in o_entries if e["action"] == action])
compare("allocator_settings", [native.get("allocator_settings", {})], [ours["allocator_settings"]])
print(f"native actions: {sorted({e['action'] for e in n_entries})}; ours: {sorted({e['action'] for e in o_entries})}")
print(f"native block states: {sorted({b['state'] for s in native['segments'] for b in s['blocks']})}; "
      f"ours: {sorted({b['state'] for s in ours['segments'] for b in s['blocks']})}")
print(f"device_traces lists: native {len(native['device_traces'])}, ours {len(ours['device_traces'])}")
print(f"segments per device: native {sorted({s['device'] for s in native['segments']})}, "
      f"ours {sorted({s['device'] for s in ours['segments']})}")
print("only in ours: " + (", ".join(extra) or "none"))
print("missing from ours: " + (", ".join(missing) or "none"))
print("type differences: " + ("; ".join(types) or "none"))
bad = missing or types
if len(ours["device_traces"]) < ndev:
    print(f"ours has {len(ours['device_traces'])} device_traces lists, the workload used {ndev} devices")
    bad = True
sys.exit(1 if bad else 0)
PY
  rc=$?
  cat "$OUTDIR/$variant-keys.txt"
  if [[ $rc -eq 0 ]]; then
    result "$variant: keys vs native" PASS "$(grep '^only in ours' "$OUTDIR/$variant-keys.txt" | cut -c1-60)"
  else
    result "$variant: keys vs native" FAIL "$(grep -E '^(missing|type|ours has)' "$OUTDIR/$variant-keys.txt" | tr '\n' ' ' | cut -c1-100)"
  fi
done
finish "$status"
