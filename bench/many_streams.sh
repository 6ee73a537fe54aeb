#!/usr/bin/env bash
# many_streams.sh — issue 36 item 1 on the GPU in one call: examples/request_server
# (16 host threads, each serving requests of three blocks, 256 B - 32 MiB
# log-uniform, on a stream of its own, every word checked) in its three
# modes, bare and under cachalloc, rounds interleaved:
#   async own         cudaMallocAsync/cudaFreeAsync on non-blocking streams: bare = CUDA's pool
#   async per-thread  the same on each thread's per-thread default stream
#   plain             cudaMalloc/cudaFree: bare = the driver
# Contenders: bare; cachalloc (this tree's build); and, when OLD_LIB names
# another libcachalloc.so (an earlier tree's, carried), that one too.
#   [ROUNDS=3] [REQUESTS=2000] [OLD_LIB=path] [CONFS="conf1;conf2"] bench/many_streams.sh [BUILD_DIR]
# CONFS adds one cachalloc contender per CACHALLOC_CONF value (";"-separated).
# Prints every run's line, then per mode a table: requests/s and the NVML
# peak above the context (median, min-max), each as a ratio to bare within
# the run, wrong words, cachalloc's cross-stream reuses (idle ones) and
# driver calls per free from its stats dump.  Last line: PASS when every
# run verified all its words, else FAIL.
set -u
cd "$(dirname "$0")/.." || exit 1
BUILD=${1:-build-gpu}
ROUNDS=${ROUNDS:-3}
REQUESTS=${REQUESTS:-2000}
if [[ ! -f "$BUILD/meson-private/coredata.dat" ]]; then
  args=(-Dbench=true -Dgpu_tests=enabled -Dtests=true)
  [[ -d .deps/usr/include ]] && { mkdir -p /tmp/cachalloc-deps && cp -r .deps/usr/include /tmp/cachalloc-deps/ && args+=(-Ddeps_include=/tmp/cachalloc-deps/include); }
  meson setup "$BUILD" "${args[@]}" >/tmp/many_streams-setup.log 2>&1 || { tail -5 /tmp/many_streams-setup.log; echo FAIL; exit 1; }
fi
ninja -C "$BUILD" shim/libcachalloc.so examples/request_server_static >/tmp/many_streams-ninja.log 2>&1 ||
  { tail -20 /tmp/many_streams-ninja.log; echo "FAIL (build)"; exit 1; }
SERVER=$PWD/$BUILD/examples/request_server_static
out=$(mktemp -d)/many_streams  # every run's output and stats dump; tarred into $OUT when set
mkdir -p "$out"

# contenders: NAME=LIB|CONF ("bare" for none)
contenders=("bare=|" "cachalloc=$PWD/$BUILD/shim/libcachalloc.so|")
[[ -n "${OLD_LIB:-}" ]] && contenders+=("old=$(realpath "$OLD_LIB")|")
IFS=';' read -r -a confs <<<"${CONFS:-}"
i=0
for c in "${confs[@]}"; do [[ -n $c ]] && contenders+=("conf$((i++))=$PWD/$BUILD/shim/libcachalloc.so|$c"); done
declare -A modes=([async-own]="--api async" [async-per-thread]="--api async --streams per-thread" [plain]="--api plain")
status=0
for round in $(seq "$ROUNDS"); do
  for mode in async-own async-per-thread plain; do
    for c in "${contenders[@]}"; do
      name=${c%%=*} spec=${c#*=}
      lib=${spec%%|*} conf=${spec#*|}
      log=$out/$mode.$name.$round
      # shellcheck disable=SC2086
      if [[ -z $lib ]]; then timeout 300 env -u LD_PRELOAD "$SERVER" ${modes[$mode]} --sizes 256:33554432 --requests "$REQUESTS" >"$log.txt" 2>&1
      else timeout 300 env LD_PRELOAD="$lib" CACHALLOC_CONF="${conf:+$conf,}stats:$log.json" "$SERVER" ${modes[$mode]} --sizes 256:33554432 --requests "$REQUESTS" >"$log.txt" 2>&1; fi
      rc=$?
      ((rc != 0)) && status=1
      echo "$mode $name round $round (exit $rc): $(grep -h 'request_server:' "$log.txt" | tail -1)"
    done
  done
done
python3 - "$out" "${contenders[@]}" <<'PY'
import glob, json, os, re, statistics, sys
out, names = sys.argv[1], [c.split("=")[0] for c in sys.argv[2:]]
line = re.compile(r"([\d.]+) requests/s\s+peak (?:\(no NVML\) )?([\d.]+) MiB\s+mismatching words (\d+)")
def med(v): return statistics.median(v) if v else float("nan")
for mode in ("async-own", "async-per-thread", "plain"):
    rows = {}
    for name in names:
        rps, peak, bad, reuses, idle, marked, cpf = [], [], 0, [], [], [], []
        for path in sorted(glob.glob(f"{out}/{mode}.{name}.*.txt")):
            m = line.search(open(path, errors="replace").read())
            if not m:
                bad += 1
                continue
            rps.append(float(m.group(1))); peak.append(float(m.group(2))); bad += int(m.group(3))
            js = path[:-4] + ".json"
            if os.path.exists(js):
                d = json.load(open(js))
                st = d["devices"][0]["stats"] if d.get("devices") else {}
                reuses.append(st.get("num_cross_stream_reuses", 0)); idle.append(st.get("num_idle_cross_stream_reuses", 0))
                marked.append(st.get("num_marked_cross_stream_reuses", 0))
                calls = d["interposer"]["calls"]
                frees = sum(v for k, v in calls.items() if "Free" in k and "Host" not in k)
                cpf.append(d["interposer"]["driver_calls"] / frees if frees else 0)
        rows[name] = (rps, peak, bad, reuses, idle, marked, cpf)
    base = rows.get("bare")
    print(f"\n{mode}: requests/s and NVML peak above the context, median (min-max) of {len(base[0]) if base else 0} rounds; ratios to bare")
    print("| contender | requests/s | x bare | peak MiB | x bare | wrong words | cross-stream reuses (idle, at a pending mark) | driver calls per free |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (rps, peak, bad, reuses, idle, marked, cpf) in rows.items():
        if not rps:
            print(f"| {name} | no result | | | | {bad} | | |"); continue
        r_ratio = med(rps) / med(base[0]) if base and base[0] else float("nan")
        p_ratio = med(peak) / med(base[1]) if base and base[1] and med(base[1]) else float("nan")
        xs = f"{med(reuses):.0f} ({med(idle):.0f}, {med(marked):.0f})" if reuses else "-"
        c = f"{med(cpf):.3f}" if cpf else "-"
        print(f"| {name} | {med(rps):,.0f} ({min(rps):,.0f}-{max(rps):,.0f}) | {r_ratio:.2f} | {med(peak):,.0f} ({min(peak):,.0f}-{max(peak):,.0f}) | {p_ratio:.2f} | {bad} | {xs} | {c} |")
PY
[[ -n "${OUT:-}" ]] && tar czf "$OUT/many_streams.tar.gz" -C "$(dirname "$out")" many_streams
if ((status == 0)) && ! grep -qh FAIL "$out"/*.txt; then echo PASS; else echo FAIL; status=1; fi
exit $status
