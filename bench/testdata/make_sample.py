#!/usr/bin/env python3
"""make_sample.py — writes bench/testdata/sample.json: a SYNTHETIC raw file of
bench/run_bench.py's schema, shaped like a default run on a 2-GPU host, with
figures invented around those issue 8 quotes (H100/H200, before the hot-path
work).  It feeds report.py's unit test (bench/report_test.py) and shows the
report's layout; it is not a measurement.  Deterministic (fixed seed).

    python3 bench/testdata/make_sample.py > bench/testdata/sample.json
"""
import json
import random

rng = random.Random(8)
MiB = 1 << 20
sizes = [512, MiB, 64 * MiB]


def jitter(x, spread=0.06):
    return round(x * rng.uniform(1 - spread, 1 + spread), 2)


# (contender, cudart, case) -> ns per size (pair cases) or a single figure (churn)
base = {
    ("bare", "static", "pair"): [64500, 66000, 135000], ("bare", "static", "churn"): 17000,
    ("bare", "static", "pair_blocking"): [66000, 65000, 120000], ("bare", "static", "churn_blocking"): 16000,
    ("bare", "static", "pair_nonblocking"): [65000, 64000, 118000], ("bare", "static", "churn_nonblocking"): 16500,
    ("bare", "static", "async"): [720, 650, 1160], ("bare", "static", "churn_async"): 1200,
    ("floor", "static", "pair"): [80, 86, 101], ("floor", "static", "pair_blocking"): [82, 88, 99],
    ("floor", "static", "pair_nonblocking"): [81, 87, 100], ("floor", "static", "async"): [40, 38, 46],
    ("torch", "torch", "pair"): [445, 561, 478], ("torch", "torch", "churn"): 994,
    ("torch", "torch", "pair_nonblocking"): [450, 560, 480], ("torch", "torch", "churn_nonblocking"): 1000,
    ("torch", "torch", "async"): [430, 540, 470], ("torch", "torch", "churn_async"): 980,
    ("cachalloc", "static", "pair"): [118, 121, 112], ("cachalloc", "static", "churn"): 265,
    ("cachalloc", "static", "pair_blocking"): [171, 168, 160], ("cachalloc", "static", "churn_blocking"): 290,
    ("cachalloc", "static", "pair_nonblocking"): [176, 174, 165], ("cachalloc", "static", "churn_nonblocking"): 305,
    ("cachalloc", "static", "async"): [88, 86, 79], ("cachalloc", "static", "churn_async"): 240,
    ("bare", "shared", "pair"): [56000, 57500, 86000], ("bare", "shared", "async"): [630, 622, 618],
    ("floor", "shared", "pair"): [107, 95, 102], ("floor", "shared", "async"): [52, 50, 49],
    ("cachalloc", "shared", "pair"): [150, 152, 140], ("cachalloc", "shared", "async"): [110, 108, 100],
}
group_of = {"pair": "pair", "churn": "pair", "pair_blocking": "blocking", "churn_blocking": "blocking",
            "pair_nonblocking": "nonblocking", "churn_nonblocking": "nonblocking", "async": "async",
            "churn_async": "async"}
samples = []
for r in range(5):
    for (c, cud, case), v in base.items():
        if isinstance(v, list):
            for s, ns in zip(sizes, v):
                samples.append({"contender": c, "cudart": cud, "group": group_of[case], "case": case, "param": s,
                                "round": r, "ns": jitter(ns), "reps": [], "iters": 10000})
        else:
            samples.append({"contender": c, "cudart": cud, "group": group_of[case], "case": case, "param": 1000,
                            "round": r, "ns": jitter(v), "reps": [], "iters": 20000})
    live = {("bare", "static", "live_plain"): [61000, 63000, 70000],
            ("bare", "static", "live_async"): [700, 705, 720, 760, 900],
            ("torch", "torch", "live_plain"): [440, 450, 470, 520, 640],
            ("torch", "torch", "live_async"): [430, 445, 460, 515, 630],
            ("cachalloc", "static", "live_plain"): [118, 120, 124, 139, 171],
            ("cachalloc", "static", "live_async"): [88, 89, 92, 101, 118]}
    for (c, cud, case), vals in live.items():
        for n, ns in zip([100, 1000, 10000, 100000, 1000000], vals):
            samples.append({"contender": c, "cudart": cud, "group": "live", "case": case, "param": n, "round": r,
                            "ns": jitter(ns), "reps": [], "iters": 10000, "fill_ns": jitter(ns * 0.6),
                            "drain_ns": jitter(ns * 0.5)})
    # aggregate ns per pair (wall / total pairs) at 1, 2, 4, 8, 16 threads
    thr = {("bare", "static", "threads_async_own"): [700, 520, 480, 470, 480],
           ("bare", "static", "threads_async_shared"): [710, 600, 650, 700, 760],
           ("torch", "torch", "threads_plain_own"): [450, 600, 800, 950, 1100],
           ("torch", "torch", "threads_plain_shared"): [450, 610, 820, 960, 1120],
           ("torch", "torch", "threads_async_own"): [440, 590, 790, 940, 1090],
           ("torch", "torch", "threads_async_shared"): [445, 600, 805, 950, 1100],
           ("cachalloc", "static", "threads_plain_own"): [180, 120, 80, 60, 52],
           ("cachalloc", "static", "threads_plain_shared"): [175, 118, 82, 66, 70],
           ("cachalloc", "static", "threads_async_own"): [90, 50, 28, 16, 10],
           ("cachalloc", "static", "threads_async_shared"): [92, 70, 66, 64, 63]}
    for (c, cud, case), vals in thr.items():
        for t, ns in zip([1, 2, 4, 8, 16], vals):
            ns = jitter(ns)
            samples.append({"contender": c, "cudart": cud, "group": "threads", "case": case, "param": t, "round": r,
                            "ns": ns, "reps": [], "iters": 100000, "threads": t, "pairs_per_s": round(1e9 / ns, 1)})
    # The floor's rows without jitter (drawing more random numbers would move every figure after them).
    for case, vals in (("threads_plain_own", [80, 45, 25, 14, 8]), ("threads_plain_shared", [80, 46, 26, 15, 9])):
        for t, ns in zip([1, 2, 4, 8, 16], vals):
            samples.append({"contender": "floor", "cudart": "static", "group": "threads", "case": case, "param": t,
                            "round": r, "ns": ns, "reps": [], "iters": 100000, "threads": t,
                            "pairs_per_s": round(1e9 / ns, 1)})

counters = []
for g, frees, dev, ev in (("pair", 62000, 6, 0), ("blocking", 61000, 8, 2400), ("nonblocking", 60000, 8, 2500),
                          ("async", 64000, 5, 0), ("live", 140000, 40, 0), ("threads", 900000, 30, 3000)):
    calls = 2 * frees
    dc = dev + ev
    fences = {"num_deferred_frees": frees if ev else 0, "num_fences": ev, "num_fence_events": ev,
              "deferred_free_bytes.peak": (24 << 20) if ev else 0, "deferred_free_bytes.current": 0}
    counters.append({"group": g, "rc": 0, "seconds": 1.1, "calls": calls, "frees": frees, "driver_calls": dc,
                     "ns_inside": calls * 160, "driver_calls_per_free": dc / frees, "ns_per_call": 160.0,
                     "driver_call_counters": ["num_device_alloc", "num_device_free", "num_sync_all_streams",
                                              "num_fence_events"],
                     "reserved_peak": 3 << 30, "calls_by_entry": {"cuMemAlloc_v2": frees, "cuMemFree_v2": frees},
                     "device_stats": dict(fences, num_device_alloc=dev, num_device_free=0, num_sync_all_streams=0),
                     "fences": fences, "ns_with_stats": {}})

runs = []
step = {"train_varlen": 21.0, "train_varlen_side": 23.5, "hf_gpt2": 9.2, "ddp_train": 31.0}
inside = {"train_varlen": 150, "train_varlen_side": 420, "hf_gpt2": 170, "ddp_train": 610}
slow = {"native": 1.0, "native_expandable": 1.01, "cachalloc": 1.02, "cachalloc_expandable": 1.03}
slow_ddp = {"native": 1.0, "native_expandable": 1.01, "cachalloc": 1.25, "cachalloc_expandable": 1.27}
peak = {"native": 6100, "native_expandable": 5300, "cachalloc": 6050, "cachalloc_expandable": 5350}
losses = {p: [(9.0 - 0.1 * i - 0.001 * len(p)).hex() for i in range(24)] for p in step}
for r in range(5):
    for kind, programs in (("suite", ["train_varlen", "hf_gpt2", "train_varlen_side"]), ("ddp", ["ddp_train"])):
        for cfg in ("native", "cachalloc", "native_expandable", "cachalloc_expandable"):
            for p in programs:
                f = (slow_ddp if p == "ddp_train" else slow)[cfg]
                ms = [jitter(step[p] * f, 0.04) for _ in range(20)]
                ms.sort()
                rec = {"program": p, "config": cfg, "round": r, "ok": True, "skipped": False, "error": None,
                       "kind": kind, "step_ms": ms, "step_ms_median": (ms[9] + ms[10]) / 2,
                       "losses": losses[p], "tokens": [[1, 2, 3]] if p == "hf_gpt2" else None,
                       "gen_ms": 85.0 if p == "hf_gpt2" else None,
                       "peak_bytes": int(jitter(peak[cfg], 0.002) * MiB), "peak_source": "nvml",
                       "baseline_bytes": 512 * MiB, "torch_mem": {"max_reserved": 0, "max_allocated": 0},
                       "process_seconds": 7.5, "exit_dumps": [], "cachalloc": None}
                if cfg.startswith("cachalloc"):
                    calls = 40000
                    ns = jitter(inside[p], 0.1)
                    rec["cachalloc"] = {"calls": calls, "ns_inside": int(ns * calls), "ns_per_call": ns,
                                        "ns_in_driver": int(0.6 * ns * calls), "ns_own_per_call": 0.4 * ns,
                                        "frees": calls // 2, "driver_calls": 30 if "side" not in p else 900,
                                        "driver_calls_per_free": (30 if "side" not in p else 900) / (calls // 2),
                                        "driver_call_counters": ["num_device_alloc", "num_device_free",
                                                                 "num_sync_all_streams", "num_fence_events"],
                                        "reserved_peak": 5 << 30}
                runs.append(rec)

raw = {
    "schema": 1,
    "meta": {"date": "2026-11-22 12:00 UTC", "host": "sample-host", "gpu": "NVIDIA H200 (SYNTHETIC SAMPLE)",
             "driver": "580.159.04", "gpu_memory": "143771 MiB", "gpus": 2, "cpu": "Intel Xeon (sample)", "cpus": 32,
             "torch": "2.11.0+cu130 True 2", "transformers": "4.57.0", "preset": "default", "dry_run": False,
             "git": "0000000 (sample)", "run_all_command": "bench/run-all.sh", "total_seconds": "412",
             "note": "synthetic data written by bench/testdata/make_sample.py for tests; not a measurement"},
    "preset": {"name": "default", "rounds": 5, "program_rounds": 5},
    "sections": [{"name": "build", "elapsed_s": 48.2, "status": "ok"},
                 {"name": "micro", "elapsed_s": 104.5, "status": "ok"},
                 {"name": "counters", "elapsed_s": 7.9, "status": "ok"},
                 {"name": "programs", "elapsed_s": 236.0, "status": "ok"},
                 {"name": "report", "elapsed_s": 1.3, "status": "ok"}],
    "errors": [],
    "micro": {"samples": samples, "notes": ["bare/static/live: live_plain: 100000 live blocks skipped (cap 10000 "
                                            "for this contender, to keep the run short)"],
              "versions": {"bare/static": {"cudart": 13000, "driver_api": 13000}}, "floor_hits": [],
              "rounds_done": 5},
    "counters": {"groups": counters, "notes": []},
    "programs": {"runs": runs, "notes": [], "rounds_done": 5},
}
print(json.dumps(raw, indent=1, sort_keys=True))
