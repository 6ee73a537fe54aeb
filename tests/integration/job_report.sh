#!/bin/sh
# job_report.sh — `cachalloc-report job DIR` (issue 37 item 4) on the dumps
# of a three-rank job run through the launcher on the fake libcuda: each rank
# is test_obs_prog with its own number of buffers, so their peaks differ, and
# one rank also runs out of memory.  The report must show every rank with
# the numbers of its own dump (read here with python's json), the rank of
# the largest peak, max/median of the peaks, the OOM, and, with matplotlib
# (in python3 or Debian's /usr/bin/python3), write a PNG of the traces
# (without it: say so, exit 1, the table still printed).  Then the error
# paths: an empty or missing folder (exit 1), a truncated dump and a JSON
# file that is no dump (named in a warning, skipped), dumps of two jobs
# mixed (warned), a dump without a rank (shown by pid, said), a rank of the
# world size without a dump (named).
#   job_report.sh LAUNCHER REPORT_SCRIPT TEST_OBS_PROG FAKE_LIBCUDA_DIR
set -u
launcher=$1 report=$2 prog=$3 fake_dir=$4
command -v python3 >/dev/null 2>&1 || { echo "job_report: SKIP (no python3)"; exit 77; }
fail() { echo "job_report: FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cachalloc-job.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# Whatever job this test itself runs in must not leak into the ranks' dumps.
vars="RANK WORLD_SIZE OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE PMIX_RANK PMI_RANK PMI_SIZE MV2_COMM_WORLD_RANK
      MV2_COMM_WORLD_SIZE FLUX_TASK_RANK FLUX_JOB_SIZE JSM_NAMESPACE_RANK JSM_NAMESPACE_SIZE SLURM_PROCID
      SLURM_NTASKS LOCAL_RANK LOCAL_WORLD_SIZE TORCHELASTIC_RUN_ID PMIX_NAMESPACE OMPI_MCA_ess_base_jobid
      FLUX_JOB_ID SLURM_JOB_ID LSB_JOBID PBS_JOBID"
unset_all=
for v in $vars; do unset_all="$unset_all -u $v"; done

# rank DIR MODE N [VAR=VALUE...]: test_obs_prog MODE N (N buffers of
# (i+1)*1000 bytes) under the launcher, its stats dump and trace in DIR.
rank() {
  dir=$1 mode=$2 n=$3
  shift 3
  # shellcheck disable=SC2086
  env $unset_all -u LD_PRELOAD LD_LIBRARY_PATH="$fake_dir" CACHALLOC_CONF= "$@" \
    "$launcher" --conf "stats:$dir/stats-%r.json,trace:$dir/trace-%r.json" -- "$prog" "$mode" "$n" \
    >"$dir/out-$n-$mode.txt" 2>&1 || { cat "$dir/out-$n-$mode.txt" >&2; fail "rank ($* $mode $n) failed"; }
}

# job: 30, 100, 200 buffers reserve about 2, 6, 20 MiB; the largest is rank 1,
# not the last; rank 2 also asks for 1 TiB (one out-of-memory error).
job=$tmp/job
mkdir "$job"
rank "$job" exit 100 RANK=0 WORLD_SIZE=3 TORCHELASTIC_RUN_ID=job-a &
rank "$job" exit 200 RANK=1 WORLD_SIZE=3 TORCHELASTIC_RUN_ID=job-a &
rank "$job" oom 30 RANK=2 WORLD_SIZE=3 TORCHELASTIC_RUN_ID=job-a &
wait
set -- "$job"/stats-*.json
[ $# -eq 3 ] || fail "expected 3 dumps: $(ls "$job")"
rm "$job"/out-*.txt  # not JSON, but the folder then holds only what cachalloc wrote

python3 "$report" job "$job" >"$tmp/report.txt" 2>"$tmp/report.err" || { cat "$tmp/report.txt" "$tmp/report.err"; fail "job exited $?"; }
cat "$tmp/report.txt"
[ -s "$tmp/report.err" ] && { cat "$tmp/report.err"; fail "warnings on a clean job folder"; }

# The report against the dumps' own numbers.
python3 - "$job" "$tmp/report.txt" <<'PY' || { cat "$tmp/report.txt"; fail "the report does not match the dumps"; }
import glob, json, re, statistics, sys
folder, text = sys.argv[1], open(sys.argv[2]).read()
dumps = {}
for path in glob.glob(folder + "/stats-*.json"):
    d = json.load(open(path))
    dumps[d["rank"]] = d
assert sorted(dumps) == [0, 1, 2], sorted(dumps)
assert {d["world_size"] for d in dumps.values()} == {3}
assert {d["job"] for d in dumps.values()} == {"TORCHELASTIC_RUN_ID=job-a"}
stats = {r: d["devices"][0]["stats"] for r, d in dumps.items()}
peaks = {r: s["reserved_bytes.all.peak"] for r, s in stats.items()}
assert len(set(peaks.values())) == 3, peaks          # the ranks differ, or nothing is tested
top = max(peaks, key=peaks.get)
assert top == 1, peaks                               # 200 buffers
imbalance = peaks[top] / statistics.median(peaks.values())
assert imbalance > 1.5, imbalance

lines = text.splitlines()
header = lines.index(next(l for l in lines if l.startswith("rank  host")))
rows = [re.split(r"\s{2,}", l.strip()) for l in lines[header + 1:] if l and not l.startswith("job:")
        and not l.startswith((" ", "reserved-allocated", "OOMs"))]
assert len(rows) == 3, rows
UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}

def size(text):  # "2.00 MiB": the value to the printed precision
    value, unit = text.split()
    return float(value) * UNITS[unit], 0.005 * UNITS[unit]

for rank, host, pid, device, reserved, allocated, slack, ooms, waits, joins in rows:
    r = int(rank)
    d, s = dumps[r], stats[r]
    assert (host, int(pid), int(device)) == (d["host"], d["pid"], d["devices"][0]["device"]), (rank, host, pid)
    for printed, want in ((reserved, s["reserved_bytes.all.peak"]), (allocated, s["allocated_bytes.all.peak"]),
                          (slack, s["reserved_bytes.all.peak"] - s["allocated_bytes.all.peak"])):
        got, tolerance = size(printed)
        assert abs(got - want) <= tolerance, (rank, printed, want)
    assert (int(ooms), int(waits), int(joins)) == (s["num_ooms"], s["num_fence_waits"], s["num_fence_joins"]), rank
assert stats[2]["num_ooms"] == 1 and stats[0]["num_ooms"] == 0, "rank 2's 1 TiB request is no OOM in its dump"

assert "job: 3 dumps (ranks 0-2) on 1 host; world size 3, every rank wrote a dump" in lines, text
m = re.search(r"^job: peak reserved imbalance \(max/median over 3 rank-device rows\): ([0-9.]+); "
              r"the max: rank ([0-9]+) ", text, re.M)
assert m, text
assert m.group(1) == f"{imbalance:.2f}", (m.group(1), imbalance)
assert int(m.group(2)) == top, m.group(2)
m = re.search(r"^job: totals: .* out-of-memory errors ([0-9]+), fence waits ([0-9]+), fence joins ([0-9]+)$",
              text, re.M)
assert m and [int(x) for x in m.groups()] == [sum(s[k] for s in stats.values())
                                              for k in ("num_ooms", "num_fence_waits", "num_fence_joins")], text
print(f"job_report: the report matches the dumps (max rank {top}, imbalance {imbalance:.2f})")
PY

# --plot: each rank's reserved memory from its trace.
if python3 -c 'import matplotlib' 2>/dev/null || /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  python3 "$report" job "$job" --plot "$tmp/job.png" >"$tmp/plot.txt" 2>&1 || { cat "$tmp/plot.txt"; fail "--plot exited $?"; }
  head -c 8 "$tmp/job.png" | od -An -c | grep -q 'P   N   G' || fail "--plot did not write a PNG"
  grep -q "^wrote $tmp/job.png: reserved memory of 3 rank-device lines" "$tmp/plot.txt" || { cat "$tmp/plot.txt"; fail "--plot: lines"; }
  echo "job_report: --plot wrote a PNG"
else
  out=$(python3 "$report" job "$job" --plot "$tmp/job.png" 2>&1) && fail "--plot without matplotlib succeeded"
  echo "$out" | grep -q 'needs matplotlib' || fail "--plot without matplotlib: unclear message: $out"
  echo "$out" | grep -q '^job: 3 dumps' || fail "--plot without matplotlib: no report: $out"
  echo "job_report: no matplotlib here; --plot says so"
fi

# expect_error NAME STATUS PATTERN COMMAND...: exits STATUS, stderr matches.
expect_error() {
  name=$1 status=$2 pattern=$3
  shift 3
  "$@" >"$tmp/e.out" 2>"$tmp/e.err"
  rc=$?
  [ $rc -eq "$status" ] || { cat "$tmp/e.out" "$tmp/e.err"; fail "$name: exited $rc, expected $status"; }
  grep -q -- "$pattern" "$tmp/e.err" || { cat "$tmp/e.err"; fail "$name: stderr lacks '$pattern'"; }
}

mkdir "$tmp/empty"
expect_error "empty folder" 1 "^cachalloc-report: no cachalloc stats dump in $tmp/empty" python3 "$report" job "$tmp/empty"
expect_error "missing folder" 1 "^cachalloc-report: cannot list $tmp/nowhere" python3 "$report" job "$tmp/nowhere"

# A truncated dump (a copy cut short) and JSON that is no dump: named, skipped.
bad=$tmp/bad
cp -r "$job" "$bad"
head -c 300 "$job/stats-0.json" >"$bad/stats-7.json"
echo '{"hello": [1, 2]}' >"$bad/notes.json"
expect_error "truncated dump" 0 "^cachalloc-report: warning: $bad/stats-7.json is not valid JSON (truncated?)" \
  python3 "$report" job "$bad"
grep -q "^cachalloc-report: warning: $bad/notes.json is not a cachalloc stats dump; skipped" "$tmp/e.err" \
  || { cat "$tmp/e.err"; fail "a JSON file that is no dump is not named"; }
grep -q '^job: 3 dumps (ranks 0-2)' "$tmp/e.out" || { cat "$tmp/e.out"; fail "skipped files changed the job"; }
grep -q 'trace-' "$tmp/e.err" && fail "traces in the folder were warned about"

# Two jobs mixed: rank 0 of another job (2 ranks) in the same folder.
other=$tmp/other
mkdir "$other"
rank "$other" exit 10 RANK=0 WORLD_SIZE=2 TORCHELASTIC_RUN_ID=job-b
mixed=$tmp/mixed
cp -r "$job" "$mixed"
cp "$other/stats-0.json" "$mixed/stats-0-b.json"
expect_error "mixed jobs" 0 "^cachalloc-report: warning: the dumps in $mixed come from 2 jobs: TORCHELASTIC_RUN_ID=job-a: " \
  python3 "$report" job "$mixed"
grep -q "^cachalloc-report: warning: rank 0 wrote 2 dumps (stats-0-b.json, stats-0.json)" "$tmp/e.err" \
  || { cat "$tmp/e.err"; fail "mixed jobs: the rank written twice is not named"; }
grep -q "^cachalloc-report: warning: the dumps disagree on the world size (2, 3)" "$tmp/e.err" \
  || { cat "$tmp/e.err"; fail "mixed jobs: the world sizes"; }

# A process with no rank variable: its dump has "rank":null; shown by pid.
norank=$tmp/norank
mkdir "$norank"
rank "$norank" exit 10
pid=$(python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["rank"] is None, d["rank"]; print(d["pid"])' \
  "$norank/stats-0.json") || fail "a dump written with no rank variable has a rank"
cp "$job/stats-1.json" "$norank/"
expect_error "no rank" 0 "^cachalloc-report: warning: 1 dump carries no rank (stats-0.json: .*): shown by pid" \
  python3 "$report" job "$norank"
grep -q "^pid $pid  " "$tmp/e.out" || { cat "$tmp/e.out"; fail "no rank: no row for pid $pid"; }
grep -q '^job: 2 dumps (rank 1, 1 process without a rank)' "$tmp/e.out" || { cat "$tmp/e.out"; fail "no rank: the job line"; }

# A rank of the world size that wrote no dump (it died before exit()).
partial=$tmp/partial
mkdir "$partial"
cp "$job/stats-0.json" "$job/stats-2.json" "$partial/"
python3 "$report" job "$partial" >"$tmp/p.out" 2>&1 || { cat "$tmp/p.out"; fail "partial job exited $?"; }
grep -q '^job: 2 dumps (ranks 0, 2) on 1 host; world size 3: no dump from rank 1 ' "$tmp/p.out" \
  || { cat "$tmp/p.out"; fail "the missing rank is not named"; }
echo "job_report: PASS"
