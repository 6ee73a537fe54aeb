#!/usr/bin/env python3
"""report_test.py — tests of the issue-8 harness that need no GPU (suite unit).

    report_test.py report
        bench/report.py on bench/testdata/sample.json (synthetic): every
        table and every target row is produced, the statuses follow from the
        sample's numbers, the PNG fallback writes valid PNGs, the docs
        section carries its markers and --update-docs splices it in place.
    report_test.py harness ALLOC_BENCH_HOST
        bench/run_bench.py --dry-run (the tiny preset, the host-malloc backend
        and bench/testdata/fake_program.py) then report.py on what it wrote:
        the whole pipeline's parsing, interleaving and sections.
    report_test.py fake ALLOC_BENCH_FAKE FLOOR_PRELOAD LIBCACHALLOC
        the micro and counters sections on the test suite's fake driver
        (LD_LIBRARY_PATH and FAKE_CUDA_TOTAL_MB set by meson): the floor's
        hooks serve, cachalloc answers, its stats dumps parse.
Exit 0 when everything holds; each failed check is printed.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FAILED = []


def check(cond, what):
    if not cond:
        FAILED.append(what)
        print(f"FAIL: {what}")


def run(args, **kw):
    p = subprocess.run([sys.executable] + args, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        print(p.stdout[-3000:], p.stderr[-3000:])
    return p


def have_matplotlib():
    return any(subprocess.run([py, "-c", "import matplotlib"], capture_output=True).returncode == 0
               for py in (sys.executable, "/usr/bin/python3") if os.access(py, os.X_OK))


def is_png(path):
    with open(path, "rb") as f:
        head = f.read(24)
    return head.startswith(b"\x89PNG\r\n\x1a\n") and os.path.getsize(path) > 1000


def target_rows(text):
    """{(id, target): status cell} from the targets table."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\| (\d+[a-z]?) \| ([^|]+) \| [^|]+ \| [^|]+ \| ([^|]+) \|", line)
        if m:
            rows[(m.group(1), m.group(2).strip())] = m.group(3).strip()
    return rows


def test_report():
    sample = os.path.join(HERE, "testdata", "sample.json")
    with tempfile.TemporaryDirectory() as tmp:
        p = run([os.path.join(HERE, "report.py"), sample, "--md", os.path.join(tmp, "r.md"), "--plots-dir", tmp,
                 "--stem", "s", "--summary-json", os.path.join(tmp, "sum.json")])
        check(p.returncode == 0, f"report.py exit {p.returncode}")
        text = p.stdout
        check(open(os.path.join(tmp, "r.md")).read().rstrip() == text.rstrip(), "--md file equals stdout")
        for head in ("### Time per section", "### Targets", "### Allocation latency", "### Ratios (within the run)",
                     "### Cost against live blocks", "### Aggregate throughput against threads",
                     "### Driver calls per free", "### Real programs", "### Notes and errors"):
            check(head in text, f"section {head!r} present")
        for row in ("bare driver: cudaMalloc+cudaFree", "CUDA pool: cudaMallocAsync+cudaFreeAsync",
                    "PyTorch: raw_alloc+raw_delete", "floor: one-slot cache behind cudaMalloc",
                    "floor: one-slot cache behind cudaMallocAsync", "**cachalloc**: cudaMalloc+cudaFree",
                    "**cachalloc**, a blocking stream alive", "**cachalloc**, a non-blocking stream alive",
                    "**cachalloc**: cudaMallocAsync+cudaFreeAsync", "(shared cudart)",
                    "cachalloc ÷ floor, plain pair", "cachalloc async ÷ CUDA pool", "cachalloc ÷ PyTorch, plain pair"):
            check(row in text, f"row {row!r} present")
        check("| 512 B | 1 MiB | 64 MiB | churn, ns/call |" in text, "latency columns")
        check("| 100 | 1,000 | 10^4 | 10^5 | 10^6 |" in text.replace("10^3", "1,000"), "live-block columns")
        check("1 thr | 2 thr | 4 thr | 8 thr | 16 thr | 16 ÷ 1" in text, "thread columns")
        # Medians and spreads: the sample's cachalloc plain pair at 512 B.
        check(re.search(r"\*\*cachalloc\*\*: cudaMalloc\+cudaFree \| \d+ \[\d+–\d+\]", text) is not None,
              "cells are median [min–max]")
        rows = target_rows(text)
        ids = {i for i, _ in rows}
        for want in ("1", "2a", "2b", "2c", "2d", "2e", "2f", "2g", "3a", "3b", "3c", "3d"):
            check(want in ids, f"target {want} present")
        status = {k[1]: v for k, v in rows.items()}
        # The sample is built so that these come out one way or the other.
        expect = {
            "plain pair vs the floor (static cudart)": "**met**",
            "plain pair, a non-blocking stream alive, vs the floor": "**MISSED**",
            "async pair vs its floor": "**MISSED**",
            "churn, 1000 live blocks 512 B–32 MiB": "**met**",
            "flat from 10² to 10⁶ live blocks (plain pair)": "**MISSED**",
            "throughput rising 1→16 threads (async pair, own stream each)": "**met**",
            "throughput rising 1→16 threads (plain pair, one stream)": "**MISSED**",
            "ddp_train: step time, cachalloc vs native": "**MISSED**",
            "train_varlen: time inside cachalloc per call (cachalloc)": "**met**",
            "train_varlen_side: time inside cachalloc per call (cachalloc)": "**MISSED**",
            "hf_gpt2: losses bit-identical across allocators": "**met**",
            "train_varlen: device peak, cachalloc vs native": "**met**",
        }
        for name, want in expect.items():
            check(status.get(name) == want, f"target {name!r}: {status.get(name)!r}, expected {want!r}")
        check(re.search(r"time inside cachalloc per call \(cachalloc\) \|[^\n]*without its driver calls[^\n]*ns",
                        text) is not None, "3c names cachalloc's own time apart from its driver calls")
        check("of it cachalloc's own (less driver calls)" in text, "programs table has the own-time column")
        check("floor (one slot per thread), plain pair, each thread its own stream" in text, "threads table: the floor")
        check(re.search(r"throughput rising 1→16 threads \(plain pair, own stream each\)[^\n]*floor 1→16 threads ×",
                        text) is not None, "2g names the floor's own scaling")
        check(status.get("driver calls per free, any number of streams") == "**met**",
              "driver calls per free, with the fence-event counter")
        check(re.search(r"\d+ met, \d+ missed, \d+ unverified, \d+ unresolved, \d+ not measured", text) is not None,
              "target counts")
        check(status.get("train_varlen: step time per round, cachalloc ÷ native") == "**met**" and
              status.get("ddp_train: step time per round, cachalloc ÷ native") == "**MISSED**",
              "3e: per-round step ratios judged on the median's interval")
        check("train_varlen: step time per round, cachalloc ÷ native | ≤ 1.05 (90% interval of the median) | "
              "1.015 [0.995–1.035] (5 rounds)" in text, "3e: the sample's ratio, its interval and rounds")

        if have_matplotlib():  # report.py finds it in this interpreter or Debian's
            for plot in ("s-threads.png", "s-live.png"):
                path = os.path.join(tmp, plot)
                check(os.path.exists(path) and is_png(path), f"{plot} is a PNG (matplotlib)")
        else:
            check("no matplotlib" in p.stderr, "without matplotlib: the plots are skipped with a message")
        summ = json.load(open(os.path.join(tmp, "sum.json")))
        check(len(summ["targets"]) == len(rows), "summary JSON has every target")

        # An older dump without the fence-event counter: only a lower bound.
        old = json.load(open(sample))
        for g in old["counters"]["groups"]:
            g["driver_call_counters"] = [c for c in g["driver_call_counters"] if "event" not in c]
        for r in old["programs"]["runs"]:
            if r.get("cachalloc"):
                r["cachalloc"]["driver_call_counters"] = ["num_device_alloc", "num_device_free"]
        old_path = os.path.join(tmp, "old.json")
        json.dump(old, open(old_path, "w"))
        o = run([os.path.join(HERE, "report.py"), old_path])
        st = {k[1]: v for k, v in target_rows(o.stdout).items()}
        check(st.get("driver calls per free, any number of streams", "").startswith("unverified"),
              "driver calls per free without the event counter is unverified (a lower bound)")
        check("no counter of the events recorded for fences" in o.stdout, "the missing event counter is named")

        d = run([os.path.join(HERE, "report.py"), sample, "--markdown-for-docs", "--stem", "s"])
        check(d.returncode == 0, "--markdown-for-docs exit 0")
        check(d.stdout.startswith("<!-- run-all:begin -->") and d.stdout.rstrip().endswith("<!-- run-all:end -->"),
              "docs section between its markers")
        check("](../bench/results/s-threads.png)" in d.stdout, "docs section links the plots")
        check("### Targets" in d.stdout, "docs section has the targets")

        doc = os.path.join(tmp, "B.md")
        with open(doc, "w") as f:
            f.write("# B\n\nbefore\n\n<!-- run-all:begin -->\nold\n<!-- run-all:end -->\n\nafter\n")
        u = run([os.path.join(HERE, "report.py"), sample, "--update-docs", doc, "--stem", "s"])
        new = open(doc).read()
        check(u.returncode == 0 and "\nold\n" not in new and new.startswith("# B\n\nbefore\n") and
              new.rstrip().endswith("after") and new.count("<!-- run-all:begin -->") == 1,
              "--update-docs replaces between the markers")
        with open(doc, "w") as f:
            f.write("# B\n")
        run([os.path.join(HERE, "report.py"), sample, "--update-docs", doc, "--stem", "s"])
        check("## 4. All contenders in one run" in open(doc).read(), "--update-docs appends with a header")

        # A programs-only run (DDP on the 2-GPU machine): no micro tables, no
        # "not measured" rows for what only a micro run measures.
        ddp = json.load(open(sample))
        ddp["sections"] = [x for x in ddp["sections"] if x["name"] in ("build", "programs", "report")]
        ddp["micro"] = {"samples": [], "notes": [], "versions": {}, "floor_hits": [], "rounds_done": 0}
        ddp["counters"] = {"groups": [], "notes": []}
        ddp["programs"]["runs"] = [x for x in ddp["programs"]["runs"] if x["kind"] == "ddp"]
        ddp_path = os.path.join(tmp, "ddp.json")
        json.dump(ddp, open(ddp_path, "w"))
        o = run([os.path.join(HERE, "report.py"), ddp_path, "--markdown-for-docs", "--marker", "run-all-ddp"])
        check(o.returncode == 0 and "ddp_train: step time, cachalloc vs native" in o.stdout and
              "not measured |" not in o.stdout and "### Allocation latency" not in o.stdout and
              "0 not measured" in o.stdout, "a programs-only run reports its targets and programs only")

        # Several runs of one tree (micro in one device call, programs in
        # another) merge into the same tables as one run holding both.
        pa, pb = json.load(open(sample)), json.load(open(sample))
        pa["programs"]["runs"], pa["programs"]["rounds_done"] = [], 0
        pa["sections"] = [x for x in pa["sections"] if x["name"] != "programs"]
        pb["micro"] = {"samples": [], "notes": [], "versions": {}, "floor_hits": [], "rounds_done": 0}
        pb["counters"] = {"groups": [], "notes": []}
        pb["sections"] = [x for x in pb["sections"] if x["name"] in ("build", "programs", "report")]
        for name, part in (("pa.json", pa), ("pb.json", pb)):
            json.dump(part, open(os.path.join(tmp, name), "w"))
        merged = run([os.path.join(HERE, "report.py"), os.path.join(tmp, "pa.json"), os.path.join(tmp, "pb.json"),
                      "--markdown-for-docs", "--stem", "s"]).stdout
        single = run([os.path.join(HERE, "report.py"), sample, "--markdown-for-docs", "--stem", "s"]).stdout
        check("comes from 2 runs of `bench/run-all.sh` on one tree" in merged and "raw data `bench/results/pb.json`"
              in merged, "a merged report names both runs")
        tables = lambda t: t[t.index("### Targets"):t.index("\nNotes:")]  # noqa: E731 (notes name their run)
        check(tables(merged) == tables(single), "merged runs give the tables of one run holding both")
        check("- micro: run 1: " in merged, "a merged report's notes say which run they are from")

        # --marker: a second block (DDP on another machine) is replaced on its own.
        with open(doc, "w") as f:
            f.write("# B\n\n<!-- run-all:begin -->\nmain\n<!-- run-all:end -->\n\n"
                    "<!-- run-all-ddp:begin -->\nold ddp\n<!-- run-all-ddp:end -->\n\nafter\n")
        run([os.path.join(HERE, "report.py"), sample, "--update-docs", doc, "--stem", "s", "--marker", "run-all-ddp"])
        new = open(doc).read()
        check("\nmain\n" in new and "old ddp" not in new and new.count("<!-- run-all-ddp:begin -->") == 1 and
              new.rstrip().endswith("after") and "### Targets" in new, "--marker replaces only its own block")


def test_median_interval():
    sys.path.insert(0, HERE)
    import report
    # n = 10: P(B <= 1) = 11/1024 on each side, so (x(2), x(9)) covers 97.85 %;
    # (x(3), x(8)) would cover only 89.1 %
    lo, hi, cover = report.median_interval(list(range(10, 0, -1)))
    check((lo, hi) == (2, 9) and abs(cover - (1 - 22 / 1024)) < 1e-12, f"median interval, n=10: {lo, hi, cover}")
    check(report.median_interval([1.0, 1.1, 0.9, 1.2]) is None, "four values: too few for 90 %")
    # n = 24: (x(8), x(17)), both inside the twelve 1.0s, whatever the tails
    lo, hi, _ = report.median_interval([0.9] * 6 + [1.2] * 3 + [1.06] * 3 + [1.0] * 12)
    check((lo, hi) == (1.0, 1.0), f"n = 24: the tails do not move the interval: {lo, hi}")
    raw = {"programs": {"runs": [
        {"program": "train_varlen", "config": c, "round": r, "ok": True, "step_ms_median": ms}
        for r, (a, b) in enumerate([(10, 10.9), (10, 9.5), (10, 11.0), (10, 9.8), (10, 10.2), (10, 10.8)])
        for c, ms in (("native", a), ("cachalloc", b))]}, "micro": {}, "counters": {}}
    rows = {t["target"]: t["status"] for t in report.evaluate(raw)}
    check(rows.get("train_varlen: step time per round, cachalloc ÷ native") == "unresolved",
          f"an interval holding 1.05 is unresolved, not met: {rows}")
    # 3f: each route contender's time per call ÷ the pool's, paired per round
    # (the pool's from call_timer); the remap contender under 1 in every
    # round, the plain route straddling 1.
    pool = [2000, 2100, 1900, 2500, 2200, 2050]
    route = [1900, 2300, 1800, 2400, 2300, 2000]
    raw = {"programs": {"runs": [
        r for i in range(6) for r in (
            {"program": "train_varlen", "config": "cudapool", "round": i, "ok": True, "step_ms_median": 20,
             "call_timer": {"ns_per_call": pool[i]}},
            {"program": "train_varlen", "config": "cachalloc_async", "round": i, "ok": True, "step_ms_median": 20,
             "cachalloc": {"ns_per_call": route[i]}},
            {"program": "train_varlen", "config": "cachalloc_async+release_remap:true", "round": i, "ok": True,
             "step_ms_median": 20, "cachalloc": {"ns_per_call": pool[i] * 0.8}})]}, "micro": {}, "counters": {}}
    got = {t["target"]: t for t in report.evaluate(raw)}
    plain = got.get("train_varlen: time per allocation call, cachalloc_async vs CUDA's pool")
    remap = got.get("train_varlen: time per allocation call, cachalloc_async+release_remap:true vs CUDA's pool")
    check(plain is not None and plain["status"] == "unresolved" and "(6 rounds)" in plain["measured"],
          f"3f: a paired ratio straddling 1 is unresolved: {plain}")
    check(remap is not None and remap["status"] == "met" and remap["measured"].startswith("0.800 [0.800–0.800]"),
          f"3f: every route contender, paired per round: {remap}")


def test_harness(host_bin):
    pin = min(os.sched_getaffinity(0))  # one CPU this test may use: every program process runs on it alone
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "raw.json")
        t = time.time()
        p = run([os.path.join(HERE, "run_bench.py"), "--out", raw, "--work", os.path.join(tmp, "w"), "--preset", "tiny",
                 "--dry-run", "--bench-static", host_bin, "--bench-shared", host_bin, "--torch-bench", host_bin,
                 "--floor", "dry", "--shim", "dry", "--gpus", "2", "--deadline", str(time.time() + 150),
                 "--pin", str(pin)], timeout=170)
        check(p.returncode == 0, f"run_bench.py --dry-run exit {p.returncode}")
        print(f"dry run: {time.time() - t:.1f} s")
        data = json.load(open(raw))
        check(data["errors"] == [], f"no errors: {data['errors'][:3]}")
        check([s["name"] for s in data["sections"]] == ["micro", "counters", "programs"], "three sections")
        check(all(s["status"] == "ok" for s in data["sections"]), f"sections ok: {data['sections']}")
        samples = data["micro"]["samples"]
        check(data["micro"]["rounds_done"] == 2, "two micro rounds")
        cases = {(s["contender"], s["cudart"], s["case"]) for s in samples}
        for want in [("bare", "static", "pair"), ("bare", "static", "async"), ("floor", "static", "pair"),
                     ("floor", "static", "async"), ("torch", "torch", "pair"), ("torch", "torch", "threads_plain_own"),
                     ("cachalloc", "static", "pair_blocking"), ("cachalloc", "static", "pair_nonblocking"),
                     ("cachalloc", "static", "churn"), ("cachalloc", "static", "live_plain"),
                     ("cachalloc", "static", "live_async"), ("cachalloc", "static", "threads_async_shared"),
                     ("bare", "static", "threads_async_own"), ("cachalloc", "shared", "pair"),
                     ("floor", "shared", "async")]:
            check(want in cases, f"micro has {want}")
        check(("floor", "static", "churn") not in cases, "the floor runs no churn")
        check(("bare", "static", "threads_plain_own") not in cases, "the bare driver runs only async threads")
        # Interleaving: within a round and group, contenders alternate (each job's samples are contiguous,
        # and the contender order repeats round after round).
        order = []
        for s in samples:
            job = (s["round"], s["group"], s["contender"], s["cudart"])
            if not order or order[-1] != job:
                order.append(job)
        check(len(order) == len(set(order)), "each job ran once per round")
        r0 = [j[1:] for j in order if j[0] == 0]
        r1 = [j[1:] for j in order if j[0] == 1]
        check(r0 == r1, "the same job order in every round")
        first = [i for i, j in enumerate(order) if j[0] == 1]
        check(bool(first) and all(j[0] == 0 for j in order[:first[0]]), "round 0 before round 1")
        pair_jobs = [j[2] for j in order if j[0] == 0 and j[1] == "pair"]
        check(pair_jobs[:4] == ["bare", "floor", "torch", "cachalloc"], f"round-robin within a group: {pair_jobs}")
        check(all(g.get("driver_calls_per_free") is not None for g in data["counters"]["groups"]), "counters parsed")
        progs = {(r["program"], r["config"]) for r in data["programs"]["runs"]}
        check(len(progs) == 16, f"4 programs x 4 configurations: {len(progs)}")
        check(data["programs"]["rounds_done"] == 2, "two program rounds")
        runs = data["programs"]["runs"]
        check(data["meta"]["pin"] == str(pin), "the pinned CPUs are in the metadata")
        check(all(r["affinity"] == [pin] for r in runs), f"every program process ran on CPU {pin} only: "
              f"{sorted({str(r['affinity']) for r in runs})}")
        check(all(r["step_cpus"] == [pin] and r["step_cpu_ms_median"] is not None for r in runs),
              "each record has the CPUs its steps ran on and the main thread's CPU time")
        for kind in ("suite", "ddp"):  # alternating order: round 1 runs the contenders in reverse
            seq = [[r["config"] for r in runs if r["round"] == k and r["kind"] == kind and
                    r["program"] in ("train_varlen", "ddp_train")] for k in (0, 1)]
            check(len(seq[0]) == 4 and seq[1] == seq[0][::-1], f"{kind}: round 1 reverses round 0: {seq}")
        rep = run([os.path.join(HERE, "report.py"), raw, "--plots-dir", tmp])
        check(rep.returncode == 0, "report.py on the dry run")
        check("### Targets" in rep.stdout and "ddp_train" in rep.stdout, "dry-run report has targets and DDP")


def test_call_timer(bench_bin, timer):
    """bench/call_timer.so in the path of the (fake) driver's allocation calls:
    every call of a run counted and timed, and the programs' reader finds it."""
    env = dict(os.environ, LD_PRELOAD=timer)
    for group, paths in (("pair", "plain"), ("async", "async")):
        p = subprocess.run([bench_bin, group, "sizes=512", "reps=2", "batch_ms=1", "churn_ms=1"], env=env,
                           capture_output=True, text=True, timeout=60)
        line = next((ln for ln in p.stderr.splitlines() if ln.startswith("CALL_TIMER ")), None)
        check(p.returncode == 0 and line is not None, f"call timer, {group}: exit {p.returncode}, a CALL_TIMER line")
        t = json.loads(line[11:]) if line else {}
        check(t.get("calls", 0) > 100 and t.get("frees", 0) * 2 == t.get("calls") and t.get("ns_inside", 0) > 0,
              f"call timer, {group}: every {paths} allocation and free counted and timed: {t}")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import common; c = common.allocator_counters(); "
            "print(c.key, c.available, c.diff(c.snapshot(), c.snapshot())['calls'] if c.available else '-')")
    p = run(["-c", code, os.path.join(HERE, "programs")], env=env, timeout=60)
    check(p.stdout.split() == ["call_timer", "True", "0"], f"the programs read the call timer: {p.stdout!r} {p.stderr[-300:]}")
    p = run(["-c", code, os.path.join(HERE, "programs")], timeout=60)
    check(p.stdout.split()[:2] == ["call_timer", "False"], f"without it, no counters: {p.stdout!r}")


def test_fake(bench_bin, floor, shim, timer=None):
    """The harness on the fake driver: micro and counters sections for real
    (LD_PRELOAD of the floor and of the shim), then the report."""
    if timer:
        test_call_timer(bench_bin, timer)
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "raw.json")
        p = run([os.path.join(HERE, "run_bench.py"), "--out", raw, "--work", os.path.join(tmp, "w"), "--preset", "tiny",
                 "--sections", "micro,counters", "--bench-static", bench_bin, "--bench-shared", bench_bin,
                 "--floor", floor, "--shim", shim, "--deadline", str(time.time() + 150)], timeout=170)
        check(p.returncode == 0, f"run_bench.py exit {p.returncode}")
        data = json.load(open(raw))
        check(data["errors"] == [], f"no errors: {data['errors'][:3]}")
        cases = {(s["contender"], s["cudart"], s["case"]) for s in data["micro"]["samples"]}
        for want in [("bare", "static", "pair"), ("floor", "static", "pair"), ("floor", "static", "async"),
                     ("cachalloc", "static", "pair"), ("cachalloc", "static", "pair_nonblocking"),
                     ("cachalloc", "static", "churn_async"), ("cachalloc", "static", "live_plain"),
                     ("cachalloc", "static", "threads_plain_own"), ("cachalloc", "shared", "async")]:
            check(want in cases, f"micro has {want}")
        hits = data["micro"]["floor_hits"]
        check(hits and all(h.get("plain_hits", 0) + h.get("async_hits", 0) > 0 for h in hits),
              f"the floor's slot served in every run: {hits[:2]}")

        def med(c, case, param):
            v = sorted(s["ns"] for s in data["micro"]["samples"]
                       if (s["contender"], s["cudart"], s["case"], s["param"]) == (c, "static", case, param))
            return v[len(v) // 2] if v else None
        bare, floor_ns, ca = med("bare", "pair", 512), med("floor", "pair", 512), med("cachalloc", "pair", 512)
        check(None not in (bare, floor_ns, ca) and floor_ns < bare / 5 and ca < bare / 5,
              f"the floor and cachalloc answer without the (fake) driver: bare {bare}, floor {floor_ns}, cachalloc {ca}")
        groups = {g["group"]: g for g in data["counters"]["groups"]}
        check(set(groups) == {"pair", "blocking", "nonblocking", "async", "live", "threads"}, f"counters: {set(groups)}")
        for g in groups.values():
            check(g.get("frees", 0) > 0 and g.get("driver_calls_per_free") is not None and "error" not in g,
                  f"counters {g['group']}: {g.get('frees')} frees, {g.get('driver_calls_per_free')}, {g.get('error')}")
        rep = run([os.path.join(HERE, "report.py"), raw, "--plots-dir", tmp])
        check(rep.returncode == 0 and "### Targets" in rep.stdout, "report.py on the fake-driver run")


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "report"
    if mode == "report":
        test_report()
        test_median_interval()
    elif mode == "harness":
        test_harness(os.path.abspath(sys.argv[2]))
    elif mode == "fake":
        test_fake(*[os.path.abspath(x) for x in sys.argv[2:6]])
    else:
        print(f"unknown mode {mode}")
        return 2
    print(f"report_test {mode}: {'PASS' if not FAILED else f'FAIL ({len(FAILED)} checks)'}")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
