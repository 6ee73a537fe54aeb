#!/usr/bin/env python3
"""run_bench.py — the measuring half of bench/run-all.sh (issue 8): runs every
contender, interleaved round by round, and writes the raw JSON that
bench/report.py turns into tables, targets and plots.

    run_bench.py --out RAW.json --work DIR [--preset default|quick|tiny]
                 [--deadline EPOCH] [--rounds N] [--sections micro,counters,programs]
                 [--bench-static P] [--bench-shared P] [--torch-bench P]
                 [--floor P] [--shim P] [--gpus N] [--dry-run] [--meta K=V ...]

Sections (each catches its own failures, prints what failed and why, and
the next one runs):
  micro     the allocation benchmark (bench/alloc_cases.h) for every
            contender: bare driver and CUDA's pool (alloc_bench, nothing
            preloaded), the floor (alloc_bench + floor_preload.so), PyTorch's
            allocator (torch_alloc_bench), cachalloc (alloc_bench +
            libcachalloc.so) — the same alloc_bench binary unmodified for all
            but PyTorch.  Per round, group by group (pair, blocking,
            nonblocking, async, live, threads), every contender once (A, B,
            C, D, then the next group; then the next round).  Static cudart;
            also shared cudart for the pair and async groups (default preset).
  counters  cachalloc once more per group with CACHALLOC_CONF=stats:PATH:
            driver calls per free and time inside it.  Kept apart from the
            timed runs because stats: turns on the wrappers' clock reads.
  programs  bench/programs/suite.py (train, hf, side phases) under each
            allocator configuration (native, cachalloc, native_expandable,
            cachalloc_expandable), interleaved round by round; DDP on two
            GPUs with torch.distributed.run when two GPUs are present.

Time: --deadline is when everything must be done; micro gets a share of
what is left (preset micro_share) and programs the rest.  A job that would
not fit is not started: the section ends early, and the JSON says so.
--dry-run runs the harness itself on a machine without a GPU: the host
backend (alloc_host) for every contender and bench/testdata/fake_program.py
for the programs; its figures mean nothing.
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

PRESETS = {
    # Meant for about 115 s of micro and 170 s of programs on one H100 (run-all.sh: 360 s with the build).
    "default": dict(rounds=5, sizes="512,1MiB,64MiB", reps=5, batch_ms=3, churn_ms=15,
                    live="100,1000,10000,100000,1000000", live_max_bare=10000,
                    threads="1,2,4,8,16", thread_reps=3, thread_ms=10, shared_cudart=True,
                    combine_groups=False,
                    program_rounds=5, configs="native,cachalloc,native_expandable,cachalloc_expandable",
                    phases="train,hf,side", steps=16, warmup=3, hf_steps=10, ddp_steps=16,
                    micro_share=0.40, counters_live="100,10000", counters_threads="1,16"),
    # Under two minutes in all (build excluded when build-gpu is current).
    # One process per contender per round (all its groups in a row), fewer
    # cases; programs: PyTorch's allocator against cachalloc only.
    "quick": dict(rounds=5, sizes="512,1MiB,64MiB", reps=3, batch_ms=1.5, churn_ms=5,
                  live="100,1000,10000,100000", live_max_bare=1000,
                  threads="1,4,16", thread_reps=1, thread_ms=6, shared_cudart=False,
                  combine_groups=True,
                  program_rounds=5, configs="native,cachalloc", phases="train,side",
                  steps=10, warmup=3, hf_steps=8, ddp_steps=8,
                  micro_share=0.45, counters_live="100,10000", counters_threads="1,16"),
    # For tests of the harness (--dry-run): seconds.
    "tiny": dict(rounds=2, sizes="512,1MiB", reps=2, batch_ms=0.5, churn_ms=1,
                 live="100,1000", live_max_bare=100, threads="1,2", thread_reps=1, thread_ms=1,
                 shared_cudart=True, combine_groups=False, program_rounds=2, configs="native,cachalloc,native_expandable,cachalloc_expandable",
                 phases="train,hf,side", steps=3, warmup=1, hf_steps=2, ddp_steps=2,
                 micro_share=0.5, counters_live="100", counters_threads="1,2"),
}

GROUP_ORDER = ["pair", "blocking", "nonblocking", "async", "live", "threads"]

T0 = time.time()


def log(msg):
    print(f"[run_bench +{time.time() - T0:6.1f}s] {msg}", flush=True)


def tail(text, n=12):
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    return "\n".join(lines[-n:])


def parse_cpus(text):
    """'2-5,8' -> {2, 3, 4, 5, 8} (taskset's list syntax); SystemExit when malformed."""
    cpus = set()
    try:
        for part in filter(None, text.split(",")):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise SystemExit(f"run_bench: --pin {text!r}: expected a CPU list such as 2-5,8")
    if not cpus:
        raise SystemExit("run_bench: --pin: empty CPU list")
    return cpus


def steal_ms():
    """The machine's CPU time stolen by its host so far, ms (/proc/stat,
    all CPUs summed; None where not reported).  A virtual machine whose host
    is busy loses this time while its threads think they are running."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) * 1000 / os.sysconf("SC_CLK_TCK") if fields[0] == "cpu" and len(fields) > 8 else None
    except (OSError, ValueError):
        return None


def run(cmd, env, timeout, cwd=ROOT, cpus=None):
    """(rc, stdout, stderr, seconds); rc 124 on timeout, 127 when it cannot start.
    cpus: the CPU set the command (and every thread it starts) may run on."""
    t = time.time()
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    try:
        p = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                           errors="replace", preexec_fn=pin)
        return p.returncode, p.stdout, p.stderr, time.time() - t
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return 124, out, err + f"\n(timed out after {timeout:.0f} s)", time.time() - t
    except OSError as e:
        return 127, "", f"cannot run {cmd[0]}: {e}", time.time() - t


def clean_env(extra=None):
    env = dict(os.environ)
    for k in ("LD_PRELOAD", "CACHALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING", "PYTORCH_CUDA_ALLOC_CONF",
              "BENCH_CACHALLOC_PLUGGABLE", "BENCH_CACHALLOC_MODULE"):
        env.pop(k, None)
    env.update(extra or {})
    return env


class Budget:
    """Deadlines, and how long each kind of job took before (to skip what
    would not fit)."""

    def __init__(self, deadline):
        self.deadline = deadline
        self.durations = {}

    def left(self, until=None):
        return (until or self.deadline) - time.time()

    def expect(self, key):
        d = self.durations.get(key)
        return max(d) if d else 0.0

    def record(self, key, seconds):
        self.durations.setdefault(key, []).append(seconds)


# --- micro ------------------------------------------------------------------------------------

def micro_contenders(a, p):
    """[(name, cudart, binary, env, groups, args)]: the groups each contender
    runs, and its arguments (one list, valid for any of its groups)."""
    base = [f"sizes={p['sizes']}", f"reps={p['reps']}", f"batch_ms={p['batch_ms']}", f"churn_ms={p['churn_ms']}",
            f"live={p['live']}", f"threads={p['threads']}", f"thread_ms={p['thread_ms']}",
            f"thread_reps={p['thread_reps']}"]
    all_groups = ["pair", "blocking", "nonblocking", "async", "live", "threads"]
    dry = a.dry_run
    out = []
    static, shared, torchb = a.bench_static, a.bench_shared, a.torch_bench
    floor_env = {} if dry else {"LD_PRELOAD": a.floor}
    shim_env = {} if dry else {"LD_PRELOAD": a.shim}
    if static:
        # The bare driver: plain path up to live_max_bare live blocks (each is a
        # cuMemAlloc of ~60 us); its threads only on the async path (CUDA's pool).
        out.append(("bare", "static", static, {}, all_groups,
                    base + [f"live_max_plain={p['live_max_bare']}", "thread_paths=async"]))
        if a.floor:  # one size from one slot per thread: no churn or live blocks; threads: the ceiling
            out.append(("floor", "static", static, floor_env, ["pair", "blocking", "nonblocking", "async", "threads"],
                        base + ["churn=0"]))
    if torchb:  # no blocking stream through c10's API
        out.append(("torch", "torch", torchb, {}, ["pair", "nonblocking", "async", "live", "threads"], base))
    if static and a.shim:
        out.append(("cachalloc", "static", static, shim_env, all_groups, base))
        for conf in [c.strip() for c in (a.cachalloc_confs or "").split(";") if c.strip()]:
            env = dict(shim_env, CACHALLOC_CONF=conf)
            out.append((f"cachalloc[{conf}]", "static", static, env, ["pair", "blocking", "nonblocking", "async"],
                        base))
    if shared and p["shared_cudart"]:
        for name, env in (("bare", {}), ("floor", floor_env), ("cachalloc", shim_env)):
            if name == "floor" and not a.floor or name == "cachalloc" and not a.shim:
                continue
            out.append((name, "shared", shared, env, ["pair", "async"], base + ["churn=0"]))
    return out


def micro_jobs(contenders, combine):
    """One round's jobs, in order: group by group, every contender once per
    group (A, B, C, D, then the next group); with `combine`, one job per
    contender running all its groups in one process."""
    if combine:
        return [(",".join(g), name, cudart, binary, env, args) for name, cudart, binary, env, g, args in contenders]
    jobs = []
    for group in GROUP_ORDER:
        for name, cudart, binary, env, groups, args in contenders:
            if group in groups:
                jobs.append((group, name, cudart, binary, env, args))
    return jobs


def round_fits(budget, until, last_round, r, notes, what):
    """Whether another round fits in what is left (rounds are all or nothing,
    so that every contender has the same number of rounds)."""
    if r == 0 or last_round is None:
        return True
    if budget.left(until) >= last_round * 1.05:
        return True
    notes.append(f"{what}: stopped after {r} rounds: {budget.left(until):.0f} s left, a round took "
                 f"{last_round:.0f} s (time budget)")
    log(notes[-1])
    return False


def parse_bench(stdout):
    results, notes, meta = [], [], {}
    for line in stdout.splitlines():
        for tag, sink in (("BENCH ", results), ("NOTE ", notes)):
            if line.startswith(tag):
                try:
                    sink.append(json.loads(line[len(tag):]))
                except ValueError:
                    pass
        for tag in ("META ", "VERSIONS "):
            if line.startswith(tag):
                try:
                    meta.update(json.loads(line[len(tag):]))
                except ValueError:
                    pass
    return results, notes, meta


def parse_floor(stderr):
    for line in (stderr or "").splitlines():
        if line.startswith("FLOOR "):
            try:
                return json.loads(line[6:])
            except ValueError:
                return None
    return None


def micro_section(a, p, raw, budget, until):
    contenders = micro_contenders(a, p)
    if not contenders:
        raw["errors"].append("micro: no contender could be built (see the build section)")
        return "failed"
    log("micro contenders: " + ", ".join(f"{c[0]}({c[1]})" for c in contenders))
    rounds = a.rounds or p["rounds"]
    samples = raw["micro"]["samples"]
    notes = raw["micro"]["notes"]
    failures = {}
    status = "ok"
    last_round = None
    jobs = micro_jobs(contenders, p.get("combine_groups", False))
    raw["micro"]["combined_groups"] = bool(p.get("combine_groups", False))
    for r in range(rounds):
        if not round_fits(budget, until, last_round, r, notes, "micro"):
            status = "partial"
            break
        t_round = time.time()
        for group, name, cudart, binary, env, args in jobs:
            key = f"{name}/{cudart}/{group}"
            if failures.get(key, 0) >= 2:
                continue  # failed (or skipped) twice: not worth the time
            if budget.left(until) < 2:
                notes.append(f"round {r + 1}: {key} not run: the micro budget is spent")
                status = "partial"
                continue
            cmd = [binary, group] + args + [f"label={name}"]
            timeout = max(5.0, min(a.job_timeout, budget.left(until) + 10))
            rc, out, err, secs = run(cmd, clean_env(env), timeout)
            budget.record(key, secs)
            results, bench_notes, meta = parse_bench(out)
            for res in results:
                res.update(contender=name, cudart=cudart, round=r, seconds=round(secs, 2))
                samples.append(res)
            for n in bench_notes:
                msg = f"{key}: {n.get('note')}"
                if msg not in notes:
                    notes.append(msg)
            if meta:
                raw["micro"]["versions"].setdefault(f"{name}/{cudart}", meta)
            if name == "floor":
                floor = parse_floor(err)
                raw["micro"]["floor_hits"].append(dict(floor or {}, group=group, cudart=cudart, round=r))
                if not a.dry_run and (floor is None or floor.get("plain_hits", 0) + floor.get("async_hits", 0) == 0):
                    raw["errors"].append(f"micro: floor {cudart} {group} round {r + 1}: the one-slot cache served "
                                         f"nothing (floor_preload.so not in the path?): {floor}")
            if rc not in (0, 77) or (rc == 0 and not results):
                failures[key] = failures.get(key, 0) + 1
                msg = f"micro: {key} round {r + 1}: exit {rc}: {tail(out + chr(10) + err, 6)}"
                raw["errors"].append(msg)
                log("FAILED " + msg)
                status = "partial"
            elif rc == 77 and not results:
                failures[key] = 2  # a SKIP does not change between rounds
                notes.append(f"{key}: SKIP: {tail(out, 2)}")
            log(f"micro round {r + 1}/{rounds} {group:<11} {name}({cudart}): {len(results)} figures, "
                f"{secs:.1f} s, exit {rc}")
        last_round = time.time() - t_round
        raw["micro"]["rounds_done"] = r + 1
        log(f"micro round {r + 1} took {last_round:.1f} s")
        write_raw(a.out, raw)
    return status


def counters_section(a, p, raw, budget, until):
    """One stats-enabled cachalloc run per group: driver calls per free."""
    if not (a.bench_static and (a.shim or a.dry_run)):
        raw["counters"]["notes"].append("no cachalloc or no alloc_bench: counters not measured")
        return "skipped"
    status = "ok"
    for group in GROUP_ORDER:
        path = os.path.join(a.work, f"counters-{group}.json")
        if os.path.exists(path):
            os.unlink(path)
        args = [f"sizes={p['sizes']}", "reps=1", f"batch_ms={p['batch_ms']}", f"churn_ms={p['churn_ms']}",
                f"live={p['counters_live']}", f"threads={p['counters_threads']}", f"thread_ms={p['thread_ms']}",
                "thread_reps=1"]
        if budget.left(until) < 3:
            raw["counters"]["notes"].append(f"{group}: not run (time budget)")
            status = "partial"
            continue
        env = {"CACHALLOC_CONF": f"stats:{path}"}
        if not a.dry_run:
            env["LD_PRELOAD"] = a.shim
        rc, out, err, secs = run([a.bench_static, group] + args + ["label=counters"], clean_env(env),
                                 max(5.0, min(a.job_timeout, budget.left(until) + 5)))
        results, _, _ = parse_bench(out)
        entry = {"group": group, "rc": rc, "seconds": round(secs, 2), "ns_with_stats": {
            f"{x['case']}:{x['param']:.0f}": x["ns"] for x in results}}
        if a.dry_run and not os.path.exists(path):
            write_fake_dump(path, group)
        try:
            with open(path) as f:
                dump = json.load(f)
            sys.path.insert(0, os.path.join(HERE, "programs"))
            import common as progcommon
            s = progcommon.summarize_dump(dump)
            entry.update(s)
            entry["calls_by_entry"] = (dump.get("interposer", {}) or {}).get("calls", {})
            entry["device_stats"] = {k: v for d in dump.get("devices", []) for k, v in (d.get("stats") or {}).items()
                                     if k.startswith("num_") or "deferred" in k or "fence" in k or "event" in k}
            entry["driver_calls_per_free"] = s["driver_calls"] / s["frees"] if s["frees"] else None
            entry.update(progcommon.per_call(dict(s)))
        except (OSError, ValueError) as e:
            entry["error"] = f"no stats dump ({e}); exit {rc}: {tail(out + err, 4)}"
            raw["errors"].append(f"counters: {group}: {entry['error']}")
            status = "partial"
        raw["counters"]["groups"].append(entry)
        log(f"counters {group}: {entry.get('driver_calls_per_free')} driver calls per free, exit {rc}, {secs:.1f} s")
    write_raw(a.out, raw)
    return status


def write_fake_dump(path, group):
    """--dry-run: what a stats dump looks like, so the parsing is exercised."""
    calls = {"pair": 40000, "blocking": 40000, "nonblocking": 40000, "async": 40000, "live": 60000,
             "threads": 90000}[group]
    dump = {"version": 1, "interposer": {"calls": {"cuMemAlloc_v2": calls // 2, "cuMemFree_v2": calls // 2},
                                         "passthrough": {"capture": 0, "foreign_pointer": 0},
                                         "ns_inside": calls * 150},
            "devices": [{"device": 0, "stats": {"num_device_alloc": 12, "num_device_free": 0,
                                                "num_sync_all_streams": 0, "reserved_bytes.all.peak": 1 << 30}}]}
    with open(path, "w") as f:
        json.dump(dump, f)


# --- programs ---------------------------------------------------------------------------------

# The program contenders (issue 18 item 5).  cachalloc_async is what the
# launcher's --torch-async sets up (PyTorch's cudaMallocAsync backend served
# by cachalloc in stream order, cachalloc's expandable segments and
# release_before_peak on; before 2026-11-26 08:30 without the latter);
# cachalloc_pluggable loads it as PyTorch's pluggable allocator
# (bench/programs/common.py reads BENCH_CACHALLOC_PLUGGABLE); cudapool is
# CUDA's own stream-ordered pool through the same PyTorch backend.
ASYNC = {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}
CONFIG_ENV = {
    "native": {},
    "native_expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "cachalloc": {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
    "cachalloc_expandable": {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
    "cachalloc_pluggable": {},
    "cachalloc_async": ASYNC,
    "cudapool": ASYNC,
    # The fence bound's next step (issue 18): joins past 256 MiB of waiting frees.
    "cachalloc_w256": {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
    "cachalloc_expandable_w256": {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
}
CACHALLOC_CONF_OF = {"cachalloc_expandable": ["expandable_segments:true"],
                     "cachalloc_async": ["expandable_segments:true", "release_before_peak:true"],
                     "cachalloc_w256": ["fence_wait_max_mb:256"],
                     "cachalloc_expandable_w256": ["expandable_segments:true", "fence_wait_max_mb:256"]}


def split_config(config):
    """'cachalloc_expandable+fence_wait_max_mb:128+thread_cache_kb:0' -> the base
    configuration and CACHALLOC_CONF entries added to it (curves and bisections
    without a new CONFIG_ENV entry per point)."""
    base, *extra = config.split("+")
    if base not in CONFIG_ENV or (extra and not base.startswith("cachalloc")):
        raise SystemExit(f"run_bench: unknown program configuration {config!r} "
                         f"(known: {', '.join(CONFIG_ENV)}; cachalloc ones may add +key:value)")
    return base, extra


def config_env(a, config, stats_path):
    base, extra = split_config(config)
    env = dict(CONFIG_ENV[base])
    if config.startswith("cachalloc"):
        conf = CACHALLOC_CONF_OF.get(base, []) + extra + [f"stats:{stats_path}"]
        env["CACHALLOC_CONF"] = ",".join(conf)
        if a.dry_run:
            pass
        elif base == "cachalloc_pluggable":
            env["BENCH_CACHALLOC_PLUGGABLE"] = a.shim
            env["BENCH_CACHALLOC_MODULE"] = a.module_dir or os.path.join(os.path.dirname(os.path.dirname(a.shim)),
                                                                         "python")
        else:
            env["LD_PRELOAD"] = a.shim
    elif base == "cudapool" and a.call_timer and not a.dry_run:
        # the pool's own time per allocation call, as cachalloc's counters give its (bench/call_timer.c)
        env["LD_PRELOAD"] = a.call_timer
    env["PYTHONHASHSEED"] = "0"
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    if a.dry_run:
        env["FAKE_ALLOCATOR"] = config
    return env


def parse_results(stdout):
    out = []
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            try:
                out.append(json.loads(line[7:]))
            except ValueError:
                pass
    return out


def median_or_none(xs):
    return statistics.median(xs) if xs else None


def program_record(res, config, r, secs, kind, steal=None):
    ms = res.get("step_ms") or []
    rec = {"program": res.get("program"), "config": config, "round": r, "ok": bool(res.get("ok")),
           "skipped": bool(res.get("skipped")), "error": res.get("error"), "kind": kind,
           "step_ms": ms, "step_ms_median": statistics.median(ms) if ms else None,
           "losses": res.get("losses"), "tokens": res.get("tokens"), "gen_ms": res.get("gen_ms"),
           "peak_bytes": (res.get("peak") or {}).get("bytes"), "peak_source": (res.get("peak") or {}).get("source"),
           "baseline_bytes": (res.get("peak") or {}).get("baseline_bytes"),
           "torch_mem": res.get("torch_mem"), "cachalloc": res.get("cachalloc"),
           "call_timer": res.get("call_timer"), "world_size": res.get("world_size"), "process_seconds": round(secs, 2),
           # why a process ran slow (common.StepTimer): the main thread's CPU
           # and run-queue time per step, the CPUs it ran on, the host's steal
           "step_cpu_ms_median": median_or_none(res.get("step_cpu_ms")),
           "step_wait_ms_median": median_or_none(res.get("step_wait_ms")),
           "step_cpus": sorted(set(res.get("step_cpus") or [])), "affinity": res.get("affinity"),
           "steal_ms": steal}
    return rec


def merge_ranks(results):
    """One record's worth of a DDP run: rank 0's steps and losses, the largest
    peak, cachalloc counters summed over ranks."""
    ranks = sorted(results, key=lambda x: x.get("rank", 0))
    base = dict(ranks[0])
    peaks = [(x.get("peak") or {}).get("bytes") for x in ranks if (x.get("peak") or {}).get("bytes") is not None]
    if peaks:
        base["peak"] = dict(base.get("peak") or {}, bytes=max(peaks), per_rank=peaks)
    cs = [x.get("cachalloc") for x in ranks if x.get("cachalloc")]
    if cs:
        tot = {k: sum(c.get(k) or 0 for c in cs) for k in ("calls", "ns_inside", "ns_in_driver", "frees",
                                                           "driver_calls")}
        tot["ns_per_call"] = tot["ns_inside"] / tot["calls"] if tot["calls"] else None
        tot["ns_own_per_call"] = (tot["ns_inside"] - tot["ns_in_driver"]) / tot["calls"] if tot["calls"] else None
        tot["driver_calls_per_free"] = tot["driver_calls"] / tot["frees"] if tot["frees"] else None
        tot["driver_call_counters"] = cs[0].get("driver_call_counters")
        # (by function, and the fence counts: summed too; the bytes held
        # back are per rank, so their largest)
        by, fences = {}, {}
        for c in cs:
            for k, v in (c.get("driver_calls_by") or {}).items():
                by[k] = by.get(k, 0) + v
            for k, v in (c.get("fences") or {}).items():
                fences[k] = fences.get(k, 0) + v if k.startswith("num_") else max(fences.get(k, 0), v)
        tot["driver_calls_by"], tot["fences"] = by, fences
        base["cachalloc"] = tot
    ts = [x.get("call_timer") for x in ranks if x.get("call_timer")]
    if ts:
        tot = {k: sum(t.get(k) or 0 for t in ts) for k in ("calls", "ns_inside", "frees")}
        tot["ns_per_call"] = tot["ns_inside"] / tot["calls"] if tot["calls"] else None
        base["call_timer"] = tot
    base["ok"] = all(x.get("ok") for x in ranks) and len(ranks) >= 2
    if len(ranks) < 2:
        base["error"] = f"only {len(ranks)} rank(s) reported"
    return base


def programs_section(a, p, raw, budget, until):
    python = a.python
    if a.dry_run:
        suite = [python, os.path.join(HERE, "testdata", "fake_program.py")]
        ddp = suite + ["--ddp"]
    else:
        suite = [python, os.path.join(HERE, "programs", "suite.py")]
        ddp = [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               os.path.join(HERE, "programs", "ddp_train.py")]
        rc, out, err, _ = run([python, "-c", "import torch,sys; print(torch.__version__, torch.cuda.is_available(), "
                               "torch.cuda.device_count())"], clean_env(), 120)
        if rc != 0:
            raw["programs"]["notes"].append(f"torch not importable: {tail(err, 3)}")
            log("programs: torch is not importable: section skipped")
            return "skipped"
        raw["meta"]["torch"] = out.strip()
        if not a.shim:
            raw["programs"]["notes"].append("libcachalloc.so not built: only the native configurations run")
    configs = [c for c in (a.configs or p["configs"]).split(",") if c]
    for c in configs:
        split_config(c)  # an unknown one stops the run here, not after a round
    if not a.shim and not a.dry_run:
        configs = [c for c in configs if not c.startswith("cachalloc")]
    args = ["--phases", a.phases or p["phases"], "--steps", str(p["steps"]), "--warmup", str(p["warmup"]),
            "--hf-steps", str(p["hf_steps"])]
    ddp_args = ["--steps", str(p["ddp_steps"]), "--warmup", str(p["warmup"])]
    with_ddp = a.gpus >= 2 and not a.no_ddp
    if not with_ddp:
        raw["programs"]["notes"].append(f"DDP not run: {a.gpus} GPU(s) here" if a.gpus < 2 else "DDP not run (--no-ddp)")
    rounds = a.program_rounds or p["program_rounds"]
    runs = raw["programs"]["runs"]
    failures = {}
    status = "ok"
    last_round = None
    for r in range(rounds):
        if not round_fits(budget, until, last_round, r, raw["programs"]["notes"], "programs"):
            status = "partial"
            break
        t_round = time.time()
        # Every other round runs the contenders in reverse (A B B A ...), so a
        # drift of the machine during a run favours none of them.
        order = configs if r % 2 == 0 else configs[::-1]
        jobs = ([] if a.ddp_only else [("suite", c) for c in order]) + \
            ([("ddp", c) for c in order] if with_ddp else [])
        for kind, config in jobs:
            key = f"{kind}/{config}"
            if failures.get(key, 0) >= 2:
                continue
            need = budget.expect(key)
            if budget.left(until) < need + 2:
                raw["programs"]["notes"].append(f"round {r + 1}: {key} not run: {budget.left(until):.0f} s left, "
                                                f"it took {need:.0f} s before")
                status = "partial"
                continue
            stats = os.path.join(a.work, f"prog-{kind}-{config}-r{r}-%p-%r.json")
            env = clean_env(config_env(a, config, stats))
            cmd = (suite + args) if kind == "suite" else (ddp + ddp_args)
            timeout = max(10.0, min(a.program_timeout, budget.left(until) + 5))
            stolen = steal_ms()
            rc, out, err, secs = run(cmd, env, timeout, cpus=a.pin_cpus)
            after = steal_ms()
            stolen = round(after - stolen, 1) if None not in (stolen, after) else None
            budget.record(key, secs)
            results = parse_results(out)
            if kind == "ddp" and results:
                results = [merge_ranks(results)]
            for res in results:
                rec = program_record(res, config, r, secs, kind, stolen)
                rec["exit_dumps"] = exit_dumps(a.work, f"prog-{kind}-{config}-r{r}-")
                runs.append(rec)
                if not rec["ok"] and not rec["skipped"]:
                    raw["errors"].append(f"programs: {rec['program']} {config} round {r + 1}: {rec['error'] or 'not ok'}")
            if rc != 0 or not results or any(not x.get("ok") and not x.get("skipped") for x in results):
                # the whole output, for the work archive (the log keeps a tail)
                with open(os.path.join(a.work, f"prog-{kind}-{config}-r{r}.out"), "w") as f:
                    f.write(f"$ {' '.join(cmd)}\nexit {rc}\n--- stdout\n{out}\n--- stderr\n{err}\n")
            if rc != 0 or not results:
                failures[key] = failures.get(key, 0) + 1
                msg = f"programs: {key} round {r + 1}: exit {rc}: {tail(out + chr(10) + err, 8)}"
                raw["errors"].append(msg)
                log("FAILED " + msg)
                status = "partial"
            log(f"programs round {r + 1}/{rounds} {key}: {len(results)} results, {secs:.1f} s, exit {rc}")
        last_round = time.time() - t_round
        raw["programs"]["rounds_done"] = r + 1
        write_raw(a.out, raw)
    return status


def exit_dumps(work, prefix):
    """Summaries of cachalloc's exit dumps of one process (whole-process figures)."""
    sys.path.insert(0, os.path.join(HERE, "programs"))
    import common as progcommon
    out = []
    for name in sorted(os.listdir(work)):
        if name.startswith(prefix) and name.endswith(".json"):
            try:
                with open(os.path.join(work, name)) as f:
                    s = progcommon.summarize_dump(json.load(f))
                progcommon.per_call(s)
                s["driver_calls_per_free"] = s["driver_calls"] / s["frees"] if s["frees"] else None
                out.append(s)
            except (OSError, ValueError):
                pass
    return out


# --- the run ----------------------------------------------------------------------------------

def write_raw(path, raw):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(raw, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def machine_meta(a):
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "host": platform.node(), "python": platform.python_version(), "preset": a.preset,
            "dry_run": a.dry_run, "gpus": a.gpus, "pin": a.pin, "order": "alternating",
            "command": " ".join(shlex.quote(x) for x in sys.argv)}
    if shutil.which("nvidia-smi") and not a.dry_run:
        rc, out, _, _ = run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                            None, 30)
        if rc == 0 and out.strip():
            rows = [r.strip() for r in out.strip().splitlines()]
            meta["gpu"] = rows[0].split(",")[0].strip()
            meta["driver"] = rows[0].split(",")[1].strip()
            meta["gpu_memory"] = rows[0].split(",")[2].strip()
            meta["gpu_list"] = rows
    try:
        meta["cpu"] = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
                           platform.processor())
        meta["cpus"] = os.cpu_count()
    except OSError:
        pass
    for kv in a.meta or []:
        k, _, v = kv.partition("=")
        meta[k] = v
    return meta


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="raw JSON to write")
    ap.add_argument("--work", required=True, help="scratch directory (stats dumps, logs)")
    ap.add_argument("--preset", default="default", choices=sorted(PRESETS))
    ap.add_argument("--deadline", type=float, default=None, help="epoch seconds by which to be done")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--program-rounds", type=int, default=None)
    ap.add_argument("--sections", default="micro,counters,programs")
    ap.add_argument("--bench-static")
    ap.add_argument("--bench-shared")
    ap.add_argument("--torch-bench")
    ap.add_argument("--floor")
    ap.add_argument("--shim")
    ap.add_argument("--call-timer", help="bench/call_timer.so: preloaded into the cudapool contender "
                    "(the pool's time per allocation call)")
    ap.add_argument("--module-dir", help="cachalloc's Python package folder (default: BUILD/python beside the shim)")
    ap.add_argument("--cachalloc-confs", default=os.environ.get("BENCH_CACHALLOC_CONFS", ""),
                    help="extra cachalloc contenders, ';'-separated CACHALLOC_CONF values (e.g. free_sync:stream)")
    ap.add_argument("--configs", default=None, help="program configurations (default: the preset's)")
    ap.add_argument("--phases", default=None)
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--no-ddp", action="store_true")
    ap.add_argument("--ddp-only", action="store_true", help="programs: only DDP (two GPUs)")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--job-timeout", type=float, default=90)
    ap.add_argument("--program-timeout", type=float, default=150)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--meta", action="append", help="K=V added to the run's metadata")
    ap.add_argument("--build-status", default=None, help="JSON file of the build section (run-all.sh)")
    ap.add_argument("--pin", default=None, help="programs: run every program process on these CPUs only "
                    "(taskset's list syntax, e.g. 2-5), the same set for every contender")
    a = ap.parse_args()
    a.pin_cpus = parse_cpus(a.pin) if a.pin else None
    if a.pin_cpus and hasattr(os, "sched_getaffinity") and not a.pin_cpus <= os.sched_getaffinity(0):
        raise SystemExit(f"run_bench: --pin {a.pin}: not all of these CPUs are available here "
                         f"({sorted(os.sched_getaffinity(0))})")
    p = PRESETS[a.preset]
    os.makedirs(a.work, exist_ok=True)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    deadline = a.deadline or (time.time() + 300)
    budget = Budget(deadline)
    raw = {"schema": 1, "meta": machine_meta(a), "preset": dict(p, name=a.preset), "sections": [], "errors": [],
           "micro": {"samples": [], "notes": [], "versions": {}, "floor_hits": [], "rounds_done": 0},
           "counters": {"groups": [], "notes": []},
           "programs": {"runs": [], "notes": [], "rounds_done": 0}}
    if a.build_status and os.path.exists(a.build_status):
        try:
            with open(a.build_status) as f:
                build = json.load(f)
            raw["sections"].append(build.get("section") or {"name": "build"})
            raw["build"] = build
            raw["errors"].extend(build.get("errors", []))
        except (OSError, ValueError) as e:
            raw["errors"].append(f"build status unreadable: {e}")
    for key in ("bench_static", "bench_shared", "torch_bench", "floor", "shim", "call_timer"):
        path = getattr(a, key)
        if path and not (os.path.exists(path) or a.dry_run):
            raw["errors"].append(f"{key}: {path} does not exist: its contender is left out")
            setattr(a, key, None)
    sections = [s for s in a.sections.split(",") if s]
    write_raw(a.out, raw)
    for name in sections:
        t = time.time()
        left = budget.left()
        if name == "micro":
            until = t + left * (p["micro_share"] if "programs" in sections else 0.9)
        elif name == "counters":
            until = t + min(left, max(10.0, 0.1 * left))
        else:
            until = deadline
        log(f"=== section {name}: {left:.0f} s left in the budget, this section until +{until - T0:.0f}s")
        fn = {"micro": micro_section, "counters": counters_section, "programs": programs_section}.get(name)
        if fn is None:
            raw["errors"].append(f"unknown section {name}")
            continue
        try:
            status = fn(a, p, raw, budget, until)
        except Exception as e:  # a bug here must not lose the other sections
            import traceback
            traceback.print_exc()
            status = "failed"
            raw["errors"].append(f"{name}: {type(e).__name__}: {e}")
        elapsed = time.time() - t
        raw["sections"].append({"name": name, "elapsed_s": round(elapsed, 1), "status": status})
        log(f"=== section {name}: {status}, {elapsed:.1f} s")
        write_raw(a.out, raw)
    raw["meta"]["measure_seconds"] = round(time.time() - T0, 1)
    write_raw(a.out, raw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
