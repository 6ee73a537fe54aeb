#!/usr/bin/env python3
"""pinned_torch.py — time per pinned host alloc+free pair in PyTorch's
CachingHostAllocator (torch.empty(..., pin_memory=True), then dropping the
tensor), the anchor for cachalloc's pinned host cache (docs/HOST.md,
docs/BENCHMARKS.md).  Sizes 4 KiB .. 256 MiB; each figure is the median of
7 runs of N pairs after a warm-up pair.  Prints one line per size:

    PINNED impl=torch size=4096 ns=... runs=7

Exit 77 without PyTorch or a GPU."""
import statistics
import sys
import time


def main():
    try:
        import torch
    except ImportError:
        print("pinned_torch: SKIP (no torch)")
        return 77
    if not torch.cuda.is_available():
        print("pinned_torch: SKIP (no GPU)")
        return 77
    torch.cuda.init()
    for size in [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20]:
        pairs = 2000 if size <= (1 << 20) else 200
        t = torch.empty(size, dtype=torch.uint8, pin_memory=True)  # warm-up: the one real cudaHostAlloc
        del t
        runs = []
        for _ in range(7):
            start = time.perf_counter_ns()
            for _ in range(pairs):
                t = torch.empty(size, dtype=torch.uint8, pin_memory=True)
                del t
            runs.append((time.perf_counter_ns() - start) / pairs)
        print(f"PINNED impl=torch size={size} ns={statistics.median(runs):.0f} runs=7 "
              f"spread={min(runs):.0f}-{max(runs):.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
