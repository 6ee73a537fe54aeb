#!/usr/bin/env python3
"""torch_memory_functions.py — torch.cuda's memory functions with cachalloc
serving PyTorch, on the GPU (scripts/gpu-check.sh, section 5).

Usage: torch_memory_functions.py --shim LIB.so --module-dir BUILD/python [--out DIR]

The same workload (torch.empty tensors of fixed sizes on device 0, some
freed, peaks reset, more allocated) runs three times, each in a child:

  native     PyTorch's own caching allocator: the reference numbers
  pluggable  cachalloc.use_with_torch(LIB) (PyTorch's pluggable allocator,
             where PyTorch's own memory_stats() raises "does not yet support
             getDeviceStats")
  preload    LD_PRELOAD=LIB, PYTORCH_NO_CUDA_MEMORY_CACHING=1 and
             cachalloc.patch_torch() (where PyTorch's answer zeros)

Under cachalloc each child checks that memory_stats(), memory_allocated(),
max_memory_allocated(), memory_reserved(), max_memory_reserved() equal
cachalloc.stats(0) at every step, that the resets act, that
memory_summary(), memory_snapshot() and torch.cuda.memory._snapshot()
describe the live tensors; every child checks memory_allocated() and
max_memory_allocated() against the sizes allocated (rounded to 512 B as
PyTorch rounds them), so the three agree.  The parent compares each
cachalloc child's last numbers with the stats dump it wrote at exit
(CACHALLOC_CONF=stats:PATH).  Exit 0 pass, 1 fail, 77 without torch or GPU.
"""
import argparse
import json
import os
import subprocess
import sys

# Small and large pool.  Each large request is split from (or fills) its
# segment exactly: a 25 MiB request would get a 26 MiB segment whose 1 MiB
# rest is too small to split off, and count 26 MiB allocated (PyTorch's rule).
SIZES = [1000, 4096, 200_000, 1 << 20, 3 << 20, 24 << 20]
LATER = [512, 5 << 20]


def rounded(n):
    return (n + 511) // 512 * 512  # PyTorch's (and cachalloc's) minimum block rounding


def fail(what):
    print(f"torch_memory_functions: FAIL: {what}", flush=True)
    sys.exit(1)


def child(mode, lib):
    import torch

    if not torch.cuda.is_available():
        print("torch_memory_functions: SKIP (no CUDA device)")
        sys.exit(77)
    cuda = torch.cuda
    cachalloc = None
    if mode != "native":
        import cachalloc
        if mode == "pluggable":
            cachalloc.use_with_torch(lib)
        else:
            cachalloc.patch_torch()

    def agree(step):
        """Under cachalloc: torch's answers are cachalloc's numbers."""
        if cachalloc is None:
            return
        ours = cachalloc.stats(0)
        theirs = dict(cuda.memory_stats(0))
        if theirs != ours:
            diff = {k: (theirs.get(k), ours.get(k)) for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k)}
            fail(f"{mode} {step}: memory_stats(0) differs from cachalloc.stats(0): {diff}")
        for fn, key in ((cuda.memory_allocated, "allocated_bytes.all.current"),
                        (cuda.max_memory_allocated, "allocated_bytes.all.peak"),
                        (cuda.memory_reserved, "reserved_bytes.all.current"),
                        (cuda.max_memory_reserved, "reserved_bytes.all.peak")):
            if fn() != ours[key] or fn(0) != ours[key]:
                fail(f"{mode} {step}: {fn.__name__}() = {fn()} but cachalloc's {key} = {ours[key]}")

    # Whatever PyTorch allocates for itself on first use (1 MiB under its
    # own allocator on the H100) is there before the test's tensors: the
    # expectations count from it.
    warm = torch.empty(1, dtype=torch.uint8, device="cuda")
    del warm
    torch.cuda.synchronize()
    cuda.reset_peak_memory_stats()
    base = cuda.memory_allocated()
    tensors = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in SIZES]
    expected = base + sum(rounded(n) for n in SIZES)
    if cuda.memory_allocated() != expected:
        fail(f"{mode}: memory_allocated() {cuda.memory_allocated()} after allocating, expected {expected}")
    agree("after allocating")
    peak = cuda.max_memory_allocated()
    if peak != expected:
        fail(f"{mode}: max_memory_allocated() {peak}, expected {expected}")

    del tensors[3:]  # the large ones
    live = base + sum(rounded(n) for n in SIZES[:3])
    if cuda.memory_allocated() != live or cuda.max_memory_allocated() != expected:
        fail(f"{mode}: after freeing: allocated {cuda.memory_allocated()} (expected {live}), "
             f"peak {cuda.max_memory_allocated()} (expected {expected})")
    agree("after freeing")
    cuda.reset_peak_memory_stats()
    if cuda.max_memory_allocated() != live:
        fail(f"{mode}: reset_peak_memory_stats(): peak {cuda.max_memory_allocated()}, expected {live}")
    agree("after reset_peak_memory_stats")
    count_before = cuda.memory_stats()["allocation.all.allocated"]
    cuda.reset_accumulated_memory_stats()
    if cuda.memory_stats()["allocation.all.allocated"] != 0 or count_before < len(SIZES):
        fail(f"{mode}: reset_accumulated_memory_stats(): allocation.all.allocated "
             f"{count_before} -> {cuda.memory_stats()['allocation.all.allocated']}")
    tensors += [torch.empty(n, dtype=torch.uint8, device="cuda") for n in LATER]
    live += sum(rounded(n) for n in LATER)
    if cuda.memory_allocated() != live or cuda.max_memory_allocated() != live:
        fail(f"{mode}: after allocating more: allocated {cuda.memory_allocated()}, "
             f"peak {cuda.max_memory_allocated()}, expected both {live}")
    agree("after allocating more")

    summary = cuda.memory_summary()
    if "Allocated memory" not in summary:
        fail(f"{mode}: memory_summary() has no table")
    snap = cuda.memory._snapshot()
    blocks = [b for s in snap["segments"] if s["device"] == 0 for b in s["blocks"]
              if b["state"] == "active_allocated"]
    if sum(b["size"] for b in blocks) != live:
        fail(f"{mode}: _snapshot(): active blocks hold {sum(b['size'] for b in blocks)} bytes, expected {live}")
    if cachalloc is not None:
        total = sum(s["total_size"] for s in snap["segments"] if s["device"] == 0)
        if total != cuda.memory_reserved():
            fail(f"{mode}: _snapshot(): segments hold {total} bytes, memory_reserved() {cuda.memory_reserved()}")
    if len(cuda.memory_snapshot()) != len(snap["segments"]):
        fail(f"{mode}: memory_snapshot() and _snapshot() differ")
    result = {"allocated": cuda.memory_allocated(), "peak": cuda.max_memory_allocated(),
              "reserved": cuda.memory_reserved(), "count": cuda.memory_stats()["allocation.all.allocated"]}
    print("RESULT " + json.dumps(result), flush=True)
    print(f"torch_memory_functions {mode}: PASS", flush=True)
    return 0


def run_child(mode, args, env):
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", mode, "--shim", args.shim],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    print(p.stdout, end="")
    if p.returncode == 77:
        sys.exit(77)
    if p.returncode != 0:
        fail(f"{mode} child exited {p.returncode}")
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if not line:
        fail(f"{mode}: no RESULT line")
    return json.loads(line[-1][len("RESULT "):])


def parent(args):
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch_memory_functions: SKIP (torch not installed)")
        return 77
    os.makedirs(args.out, exist_ok=True)
    base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "CACHALLOC_CONF")}
    base["PYTHONPATH"] = args.module_dir + os.pathsep + base.get("PYTHONPATH", "")
    native = run_child("native", args, base)
    runs = {
        "pluggable": {},
        "preload": {"LD_PRELOAD": args.shim, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
    }
    for mode, extra in runs.items():
        dump_path = os.path.join(args.out, f"torch-memory-{mode}.json")
        if os.path.exists(dump_path):
            os.unlink(dump_path)
        got = run_child(mode, args, dict(base, CACHALLOC_CONF=f"stats:{dump_path}", **extra))
        for key in ("allocated", "peak"):
            if got[key] != native[key]:
                fail(f"{mode}: {key} {got[key]} differs from PyTorch's own allocator ({native[key]})")
        with open(dump_path) as f:
            dump = json.load(f)
        dev = [d for d in dump["devices"] if d["device"] == 0 and not d.get("context_destroyed")]
        if not dev:
            fail(f"{mode}: the dump {dump_path} has no device 0")
        stats = dev[0]["stats"]
        # at exit every tensor is freed: the peak and the count stay what the child printed
        if stats["allocated_bytes.all.peak"] != got["peak"] or stats["allocation.all.allocated"] != got["count"]:
            fail(f"{mode}: the dump says peak {stats['allocated_bytes.all.peak']}, count "
                 f"{stats['allocation.all.allocated']}; torch said {got['peak']}, {got['count']}")
        print(f"{mode}: torch.cuda = cachalloc = dump: allocated {got['allocated']}, peak {got['peak']}, "
              f"reserved {got['reserved']}, {got['count']} allocations since the reset")
    print("torch_memory_functions: PASS")
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shim", required=True)
    p.add_argument("--module-dir", default="")
    p.add_argument("--out", default=".")
    p.add_argument("--child")
    args = p.parse_args()
    if args.child:
        return child(args.child, args.shim)
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
