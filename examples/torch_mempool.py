#!/usr/bin/env python3
"""torch_mempool.py — cachalloc for one region of a PyTorch program.

    python3 examples/torch_mempool.py            # the region in a cachalloc MemPool
    python3 examples/torch_mempool.py --plain    # the same computation, no pool
    python3 examples/torch_mempool.py --compare  # both (child processes), compared

PyTorch keeps its own caching allocator for the program; only the
allocations made inside

    pool = torch.cuda.MemPool(cachalloc_allocator.allocator())
    with torch.cuda.use_mem_pool(pool):
        ...

come from a pool whose segments PyTorch asks cachalloc for
(cachalloc_malloc / cachalloc_free through CUDAPluggableAllocator;
cachalloc.mem_pool() builds it).  The region here is a few training steps of
a small model whose activations are allocated in the pool (its gradients are
not: backward allocates them on PyTorch's autograd thread, and use_mem_pool
routes only the calling thread's allocations).

Checks, in one process: the region's results equal those of the same
computation run outside any pool before it (bit for bit); the pool's tensors
lie in memory cachalloc handed out (cachalloc_get_base_allocation) while
the tensors outside do not; cachalloc's statistics show the segments.  Prints
`RESULT` lines (losses and checksums as float.hex) and
`torch_mempool: PASS`; --compare passes when the pool run and the --plain
run print identical RESULT lines.  Exit 77: no torch, no GPU, or a PyTorch
without MemPool.

Module and library are found as torch_pluggable.py finds them.
"""
import argparse
import ctypes
import os
import subprocess
import sys

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_pluggable import import_cachalloc  # noqa: E402


def region(torch, F, model, opt, x, y, steps):
    """A few training steps; returns the losses (floats)."""
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def build(torch, nn, seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(1024, 2048), nn.GELU(), nn.Linear(2048, 2048), nn.GELU(),
                          nn.Linear(2048, 16)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, opt


def checksum(model):
    return sum(p.detach().double().sum().item() for p in model.parameters())


def in_cachalloc(cachalloc, ptr):
    """Whether `ptr` lies in a block cachalloc handed out."""
    base, size = ctypes.c_void_p(), ctypes.c_size_t()
    return cachalloc.load().cachalloc_get_base_allocation(ptr, ctypes.byref(base), ctypes.byref(size)) == 0


def run(args):
    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
    except ImportError:
        print("torch_mempool: SKIP (torch not installed)")
        return 77
    if not torch.cuda.is_available():
        print("torch_mempool: SKIP (no CUDA device)")
        return 77
    if not hasattr(torch.cuda, "MemPool"):
        print("torch_mempool: SKIP (this PyTorch has no torch.cuda.MemPool)")
        return 77
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(256, 1024, generator=gen).cuda()
    y = torch.randint(0, 16, (256,), generator=gen).cuda()

    # The reference, with PyTorch's own allocator, in this process.
    model, opt = build(torch, nn, 0)
    ref = region(torch, F, model, opt, x, y, args.steps)
    ref_sum = checksum(model)
    del model, opt

    model, opt = build(torch, nn, 0)
    ok = True
    if args.plain:
        losses = region(torch, F, model, opt, x, y, args.steps)
    else:
        cachalloc = import_cachalloc()
        pool = cachalloc.mem_pool(args.lib)
        with torch.cuda.use_mem_pool(pool):
            losses = region(torch, F, model, opt, x, y, args.steps)
            inside = torch.empty(1 << 20, device="cuda")
        outside = torch.empty(1 << 20, device="cuda")
        grads_in_pool = all(in_cachalloc(cachalloc, p.grad.untyped_storage().data_ptr())
                            for p in model.parameters())
        placed = (in_cachalloc(cachalloc, inside.untyped_storage().data_ptr())
                  and not in_cachalloc(cachalloc, outside.untyped_storage().data_ptr())
                  and not in_cachalloc(cachalloc, x.untyped_storage().data_ptr()))
        s = cachalloc.stats(torch.cuda.current_device())
        print(f"CACHALLOC segments_served {s.get('allocation.all.allocated', 0)} "
              f"bytes_in_use {s.get('allocated_bytes.all.current', 0)} "
              f"reserved_peak_bytes {s.get('reserved_bytes.all.peak', 0)}")
        # Gradients are made by backward on PyTorch's autograd thread, which
        # use_mem_pool (a per-thread setting) does not route to the pool.
        print(f"placement: pool tensors in cachalloc memory {placed}, gradients in it {grads_in_pool} "
              "(backward allocates on the autograd thread, outside use_mem_pool)")
        ok = placed and s.get("allocation.all.allocated", 0) > 0
        cachalloc.validate()
        # Done with the region: its tensors die, PyTorch releases the pool's segments.
        del inside, outside, model, opt, pool
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        left = cachalloc.stats(torch.cuda.current_device()).get("allocated_bytes.all.current", -1)
        print(f"NOTE cachalloc bytes still allocated after the pool was released: {left}")
    for i, v in enumerate(losses):
        print(f"RESULT step {i} loss {v!r} {v.hex()}")
    same = losses == ref
    print(f"reference (no pool, same process): {'identical' if same else 'DIFFERENT'}")
    print(f"RESULT reference checksum {ref_sum!r} {ref_sum.hex()}")
    ok = ok and same and losses[-1] < losses[0]
    print(f"torch_mempool: {'PASS' if ok else 'FAIL'} ({'plain' if args.plain else 'MemPool'}, "
          f"loss {losses[0]:.6f} -> {losses[-1]:.6f})")
    return 0 if ok else 1


def compare(args):
    outs = {}
    for mode in ("pool", "plain"):
        cmd = [sys.executable, os.path.abspath(__file__), "--steps", str(args.steps)]
        cmd += ["--plain"] if mode == "plain" else []
        cmd += ["--lib", args.lib] if args.lib else []
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
        sys.stdout.write(p.stdout)
        if p.returncode == 77:
            return 77
        outs[mode] = (p.returncode, [l for l in p.stdout.splitlines() if l.startswith("RESULT ")])
    same = outs["pool"][1] == outs["plain"][1] and outs["pool"][1]
    ok = same and outs["pool"][0] == 0 and outs["plain"][0] == 0
    print(f"compare: RESULT lines {'identical' if same else 'DIFFER'}")
    print(f"torch_mempool --compare: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plain", action="store_true", help="no MemPool: the baseline")
    ap.add_argument("--compare", action="store_true", help="pool and plain runs, compared")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--lib", default=None, help="libcachalloc.so (default: cachalloc.library_path())")
    args = ap.parse_args()
    return compare(args) if args.compare else run(args)


if __name__ == "__main__":
    sys.exit(main())
