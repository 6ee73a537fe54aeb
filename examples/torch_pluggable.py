#!/usr/bin/env python3
"""torch_pluggable.py — PyTorch with cachalloc as its CUDA allocator, no LD_PRELOAD.

    python3 examples/torch_pluggable.py --allocator pluggable   # cachalloc
    python3 examples/torch_pluggable.py --allocator native      # PyTorch's own
    python3 examples/torch_pluggable.py --compare               # both, compared

With --allocator pluggable the script calls cachalloc.use_with_torch()
(torch.cuda.memory.change_current_allocator with a CUDAPluggableAllocator
over cachalloc_malloc/cachalloc_free, and cachalloc's hooks wired) before its
first CUDA allocation, then trains a small conv + MLP model with fixed seeds
and deterministic kernels.  The loop also exercises what the hooks serve:
torch.cuda.set_per_process_memory_fraction (memory fraction hook), a side
stream whose tensors are handed back with Tensor.record_stream (record
stream hook), and torch.cuda.empty_cache() (reset hook).

Prints `RESULT` lines (each loss and a parameter checksum, with full
precision and as float.hex), `TIME` (median step time after warm-up),
cachalloc's own statistics in pluggable mode, and `torch_pluggable: PASS`.
--compare runs the script once per allocator in child processes and passes
when both pass with identical RESULT lines.  Exit 77: no torch or no GPU.

The cachalloc module is found through CACHALLOC_PYTHON (a directory holding
cachalloc.py, e.g. build/python), then an installed `cachalloc`, then this
repository's python/; the library through --lib, then cachalloc's own rules
(CACHALLOC_LIBRARY, the path it was configured with).
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
HERE = os.path.dirname(os.path.abspath(__file__))


def import_cachalloc():
    """The cachalloc module (see the docstring for where it is looked for)."""
    first = os.environ.get("CACHALLOC_PYTHON")
    if first:
        sys.path.insert(0, first)
    try:
        import cachalloc
    except ImportError:
        sys.path.append(os.path.join(HERE, "..", "python"))
        import cachalloc
    return cachalloc


def make_model(nn):
    # The wide layer puts weights, grads and momentum in the large pool;
    # activations land in the small one.
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1, stride=2), nn.ReLU(),
        nn.Flatten(),
        nn.Linear(32 * 16 * 16, 2048), nn.ReLU(),
        nn.Linear(2048, 10))


def train(args):
    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
    except ImportError:
        print("torch_pluggable: SKIP (torch not installed)")
        return 77
    if not torch.cuda.is_available():
        print("torch_pluggable: SKIP (no CUDA device)")
        return 77
    cachalloc = None
    if args.allocator == "pluggable":
        cachalloc = import_cachalloc()
        cachalloc.use_with_torch(args.lib)  # before the first CUDA allocation
        try:
            torch.cuda.set_per_process_memory_fraction(0.9)  # the memory fraction hook
            print(f"memory fraction: {cachalloc.get_per_process_memory_fraction(torch.cuda.current_device())}")
        except RuntimeError as e:  # a PyTorch whose pluggable allocator refuses it
            print(f"memory fraction: not forwarded by this PyTorch ({e})")
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    model = make_model(nn).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(64, 3, 32, 32, generator=gen) for _ in range(4)]
    ys = [torch.randint(0, 10, (64,), generator=gen) for _ in range(4)]
    side = torch.cuda.Stream()

    losses, times = [], []
    for step in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        # The batch is staged on a side stream, then used on the current one:
        # record_stream keeps its memory from being reused early.
        with torch.cuda.stream(side):
            x = xs[step % 4].cuda(non_blocking=False)
            y = ys[step % 4].cuda(non_blocking=False)
        torch.cuda.current_stream().wait_stream(side)
        x.record_stream(torch.cuda.current_stream())
        y.record_stream(torch.cuda.current_stream())
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        value = loss.item()
        times.append(time.perf_counter() - t0)
        losses.append(value)
        print(f"RESULT step {step} loss {value!r} {value.hex()}")
        del x, y, loss
        if step == args.steps // 2:
            torch.cuda.empty_cache()  # the reset hook (cachalloc_pluggable_empty_cache)
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"RESULT parameter checksum {checksum!r} {checksum.hex()}")
    warm = times[min(3, len(times) - 1):]
    print(f"TIME {args.allocator} median_step_ms {1000 * statistics.median(warm):.3f} "
          f"mean_step_ms {1000 * statistics.mean(warm):.3f}")

    ok = all(v == v and abs(v) != float("inf") for v in losses) and losses[-1] < losses[0]
    if cachalloc is not None:
        torch.cuda.synchronize()
        s = cachalloc.stats(torch.cuda.current_device())
        served = s.get("allocation.all.allocated", 0)
        device_allocs = s.get("num_device_alloc", 0)
        print(f"CACHALLOC allocations {served} device_allocations {device_allocs} "
              f"reserved_peak_bytes {s.get('reserved_bytes.all.peak', 0)} "
              f"allocated_peak_bytes {s.get('allocated_bytes.all.peak', 0)}")
        if served == 0 or device_allocs >= served:
            print("torch_pluggable: cachalloc served no allocation from its cache")
            ok = False
        cachalloc.validate()
        if args.summary:
            print(cachalloc.memory_summary(torch.cuda.current_device()))
    print(f"torch_pluggable: {'PASS' if ok else 'FAIL'} ({args.allocator}, loss {losses[0]:.6f} -> {losses[-1]:.6f})")
    return 0 if ok else 1


def compare(args):
    runs = {}
    for allocator in ("native", "pluggable"):
        cmd = [sys.executable, os.path.abspath(__file__), "--allocator", allocator, "--steps", str(args.steps)]
        if args.lib:
            cmd += ["--lib", args.lib]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
        sys.stdout.write(p.stdout)
        if p.returncode == 77:
            return 77
        runs[allocator] = (p.returncode, [l for l in p.stdout.splitlines() if l.startswith("RESULT ")],
                           [l for l in p.stdout.splitlines() if l.startswith("TIME ")])
    same = runs["native"][1] == runs["pluggable"][1] and runs["native"][1]
    ok = same and runs["native"][0] == 0 and runs["pluggable"][0] == 0
    for a in ("native", "pluggable"):
        print(f"compare: {a}: exit {runs[a][0]}, {' '.join(runs[a][2])}")
    print(f"compare: RESULT lines {'identical' if same else 'DIFFER'}")
    print(f"torch_pluggable --compare: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--allocator", choices=["native", "pluggable"], default="pluggable")
    ap.add_argument("--compare", action="store_true", help="run native and pluggable, compare the results")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--lib", default=None, help="libcachalloc.so (default: cachalloc.library_path())")
    ap.add_argument("--summary", action="store_true", help="print cachalloc's memory summary at the end")
    args = ap.parse_args()
    return compare(args) if args.compare else train(args)


if __name__ == "__main__":
    sys.exit(main())
