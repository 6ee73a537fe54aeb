#!/usr/bin/env python3
"""cupy_client.py — CuPy with its memory pool switched off.

cupy.cuda.set_allocator(None) makes every array a cudaMalloc/cudaFree, which
reaches the driver as cuMemAlloc_v2/cuMemFree_v2.  Computes a matmul, an
elementwise expression, a sort and many small reductions, each checked
against NumPy.  Exit 77 without cupy or GPU.
"""
import sys

import numpy as np

try:
    import cupy as cp
except ImportError:
    print("cupy_client: SKIP (cupy not installed)")
    sys.exit(77)


def main():
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no device")
    except Exception as e:  # CUDARuntimeError when there is no driver
        print(f"cupy_client: SKIP (no CUDA device: {e})")
        return 77
    cp.cuda.set_allocator(None)
    failures = []
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1024, 1024))
    b = rng.standard_normal((1024, 1024))
    ga, gb = cp.asarray(a), cp.asarray(b)

    c = ga @ gb
    if not np.allclose(c.get(), a @ b, rtol=1e-10, atol=1e-9):
        failures.append("matmul differs from numpy")
    e = cp.sin(ga) * 2.0 + gb * gb
    if not np.allclose(e.get(), np.sin(a) * 2.0 + b * b, rtol=1e-12, atol=1e-12):
        failures.append("elementwise differs from numpy")
    if not np.array_equal(cp.sort(ga.ravel()).get(), np.sort(a.ravel())):
        failures.append("sort differs from numpy")

    # Many short-lived arrays of several sizes: a cache reuses their blocks.
    sizes = [1, 100, 4096, 100_000, 1 << 20, 5 << 20]
    for i in range(300):
        n = sizes[i % len(sizes)]
        x = cp.full(n, i % 1000, dtype=cp.int64)
        if int(x.sum()) != (i % 1000) * n:
            failures.append(f"sum of {n} x {i % 1000} wrong")
            break
        del x

    print(f"RESULT matmul sum {float(c.sum())!r}")
    print(f"RESULT elementwise sum {float(e.sum())!r}")
    for f in failures:
        print(f"  {f}")
    print(f"cupy_client: {'FAIL' if failures else 'PASS'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
