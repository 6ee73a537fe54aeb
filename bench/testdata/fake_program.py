#!/usr/bin/env python3
"""fake_program.py — stands in for bench/programs/suite.py (and, with --ddp,
for a two-rank ddp_train.py launch) in `run_bench.py --dry-run`, so the
harness's programs section can be exercised without torch or a GPU.  Prints
RESULT lines of the real programs' shape; FAKE_ALLOCATOR (set by the
harness) picks plausible figures.  Nothing here is a measurement."""
import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "programs"))
import common  # noqa: E402  (the real programs' /proc reading; torch is imported only where used)

ap = argparse.ArgumentParser()
ap.add_argument("--phases", default="train,hf,side")
ap.add_argument("--steps", type=int, default=4)
ap.add_argument("--warmup", type=int, default=1)
ap.add_argument("--hf-steps", type=int, default=2)
ap.add_argument("--ddp", action="store_true")
args = ap.parse_args()


config = os.environ.get("FAKE_ALLOCATOR", "native")
rng = random.Random()
names = {"train": "train_varlen", "hf": "hf_gpt2", "side": "train_varlen_side"}
base_ms = {"train_varlen": 21.0, "hf_gpt2": 9.0, "train_varlen_side": 23.0, "ddp_train": 33.0}
phases = ["ddp"] if args.ddp else [p for p in args.phases.split(",") if p]
for phase in phases:
    program = "ddp_train" if phase == "ddp" else names[phase]
    steps = args.hf_steps if phase == "hf" else args.steps
    losses = [9.0 - 0.25 * i for i in range(args.warmup + steps)]
    slow = 1.03 if config.startswith("cachalloc") else 1.0
    for rank in range(2 if args.ddp else 1):
        res = {"program": program, "ok": True, "steps": steps, "warmup": args.warmup,
               "step_ms": [base_ms[program] * slow * rng.uniform(0.97, 1.05) for _ in range(steps)],
               "losses": [v.hex() for v in losses], "loss_values": losses, "allocator": config,
               "peak": {"bytes": int((5.0 if "expandable" in config else 5.5) * 2**30 * rng.uniform(0.999, 1.001)),
                        "baseline_bytes": 600 << 20, "source": "nvml"},
               "torch_mem": {"max_reserved": 0, "max_allocated": 0}}
        # what common.StepTimer adds (the harness's --pin is checked through these)
        res.update(step_cpu_ms=[ms * 0.98 for ms in res["step_ms"]], step_wait_ms=[0.0] * steps,
                   step_cpus=[common.thread_sched()[2]] * steps,
                   affinity=sorted(os.sched_getaffinity(0)))
        if phase == "hf":
            res["tokens"] = [[3, 24, 171], [5, 38, 269]]
            res["gen_ms"] = 80.0
        if args.ddp:
            res.update(rank=rank, world_size=2)
        if config.startswith("cachalloc"):
            calls = 2000 * steps
            res["cachalloc"] = {"calls": calls, "ns_inside": calls * rng.randint(150, 260), "frees": calls // 2,
                                "driver_calls": 3, "driver_call_counters": ["num_device_alloc", "num_device_free"],
                                "reserved_peak": 5 << 30}
            res["cachalloc"]["ns_per_call"] = res["cachalloc"]["ns_inside"] / calls
            res["cachalloc"]["driver_calls_per_free"] = 3 / (calls // 2)
        print("RESULT " + json.dumps(res), flush=True)
