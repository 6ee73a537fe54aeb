#!/usr/bin/env python3
"""torch_pluggable_graphs.py — CUDA graphs and out of memory with cachalloc
as PyTorch's pluggable allocator (cachalloc.use_with_torch(); issue 35
item 2; scripts/gpu-check.sh, section 5).

Usage: torch_pluggable_graphs.py --module-dir BUILD/python --shim LIB.so

In one process, with default settings:
  1. torch.cuda.graph captures a step whose temporaries are allocated and
     freed inside the capture (global capture mode, PyTorch's default); 50
     replays, each followed by allocations and frees of other tensors that
     are filled and checked, must give the eager result every time.
  2. The graph's pool holds memory until the graph is deleted; after `del`
     (PyTorch releases the pool) the driver gets it back: device memory
     used (cudaMemGetInfo) falls by at least the pool's bytes.
  3. Several graphs sharing one pool (torch.cuda.graph_pool_handle()) replay
     in capture order with correct results.
  4. An allocation larger than the device raises torch.OutOfMemoryError
     (not a NULL tensor), and the next allocation works: the OOM companion
     (cachalloc/torch_companion.py; --no-oom leaves it out).
Prints `torch_pluggable_graphs: PASS` or FAIL lines; exit 77 without
torch or a GPU.
"""
import argparse
import sys


def fail(what):
    print(f"torch_pluggable_graphs: FAIL: {what}")
    sys.exit(1)


def step(x, w):
    t = x @ w              # temporaries allocated and freed inside the capture
    u = torch.relu(t) * 2
    v = u.sum(dim=1, keepdim=True)
    return (u - v / u.shape[1]).tanh()


def used_bytes():
    free, total = torch.cuda.mem_get_info()
    return total - free


def main():
    global torch
    ap = argparse.ArgumentParser()
    ap.add_argument("--module-dir", required=True)
    ap.add_argument("--shim", required=True)
    ap.add_argument("--no-oom", dest="oom", action="store_false",
                    help="without the OOM companion (an out of memory then hands PyTorch NULL: not checked)")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("torch_pluggable_graphs: SKIP: no torch")
        return 77
    if not torch.cuda.is_available():
        print("torch_pluggable_graphs: SKIP: no GPU")
        return 77
    sys.path.insert(0, args.module_dir)
    import cachalloc

    cachalloc.use_with_torch(args.shim, oom_error=args.oom)
    torch.manual_seed(0)
    n = 4096  # 64 MiB tensors: the capture's pool is a few hundred MiB
    x = torch.randn(n, n, device="cuda")
    w = torch.randn(n, n, device="cuda") / n ** 0.5
    expected = step(x, w)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up, as PyTorch's docs ask
        for _ in range(3):
            step(x, w)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # torch.cuda.graph empties the cache at its start too
    used_before = used_bytes()

    # 1. capture with the default (global) mode, replays beside other work
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step(x, w)
    torch.cuda.empty_cache()  # what remains is the graph's pool
    used_with_graph = used_bytes()
    for i in range(50):
        g.replay()
        others = [torch.full((1 << 18,), float(i + k), device="cuda") for k in range(8)]
        torch.cuda.synchronize()
        if not torch.equal(out, expected):
            fail(f"replay {i}: the graph's output differs from the eager step")
        for k, t in enumerate(others):
            if not bool((t == float(i + k)).all()):
                fail(f"replay {i}: a tensor allocated beside the graph was overwritten")
        del others
    print(f"graphs: 50 replays equal to the eager step; pool {(used_with_graph - used_before) >> 20} MiB")

    # 2. the pool goes back when the graph is gone
    del out, g
    torch.cuda.synchronize()
    torch.randn(16, device="cuda")  # a call outside any capture gives released blocks back
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    used_after = used_bytes()
    pool_bytes = used_with_graph - used_before
    if pool_bytes < (128 << 20):
        fail(f"the capture's pool holds {pool_bytes >> 20} MiB: expected its temporaries and output (>= 128 MiB)")
    if used_after > used_before + pool_bytes // 4:
        fail(f"graph deleted, its pool's memory not given back: used {used_before >> 20} MiB before the "
             f"capture, {used_with_graph >> 20} with the graph, {used_after >> 20} after")
    print(f"release: used {used_before >> 20} -> {used_with_graph >> 20} -> {used_after >> 20} MiB")

    # 3. graphs sharing one pool
    pool = torch.cuda.graph_pool_handle()
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1, pool=pool):
        a = step(x, w)
    with torch.cuda.graph(g2, pool=pool):
        b = step(a, w)
    want_b = step(expected, w)
    for i in range(10):
        g1.replay()
        g2.replay()
        torch.cuda.synchronize()
        if not (torch.equal(a, expected) and torch.allclose(b, want_b, rtol=1e-5, atol=1e-6)):
            fail(f"shared pool, replay {i}: wrong output")
    del a, b, g1, g2
    print("shared pool: 10 replays of two graphs correct")

    if not args.oom:
        print("torch_pluggable_graphs: PASS")
        return 0
    # 4. out of memory
    total = torch.cuda.get_device_properties(0).total_memory
    try:
        torch.empty(total * 2, dtype=torch.uint8, device="cuda")
        fail("an allocation twice the device's size did not raise")
    except torch.OutOfMemoryError as e:
        print(f"oom: torch.OutOfMemoryError: {str(e).splitlines()[0][:120]}")
    y = torch.ones(1 << 20, device="cuda")
    if float(y.sum()) != float(1 << 20):
        fail("the allocation after the out-of-memory error")
    print("torch_pluggable_graphs: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
