#!/usr/bin/env python3
"""numba_client.py — numba-cuda device arrays and a kernel.

numba allocates device arrays with cuMemAlloc_v2 (dlsym on the libcuda
handle).  A saxpy kernel and many short-lived arrays of several sizes, each
checked on the host.  numba defers frees; the pending ones are flushed each
iteration so blocks really go back and can be reused.  Exit 77 without numba
or GPU.
"""
import sys

import numpy as np

# numba-cuda releases that predate NumPy 2.4 still register np.row_stack
# (removed from NumPy) when compiling their first kernel; give them the alias.
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack

try:
    from numba import cuda
except ImportError:
    print("numba_client: SKIP (numba not installed)")
    sys.exit(77)


@cuda.jit
def saxpy(a, x, y, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


@cuda.jit
def iota_plus(k, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = i + k


def flush_pending_frees():
    try:
        cuda.current_context().deallocations.clear()
    except AttributeError:
        pass


def main():
    if not cuda.is_available():
        print("numba_client: SKIP (no CUDA device)")
        return 77
    failures = []
    n = 1 << 20
    x = np.arange(n, dtype=np.float32)
    y = np.full(n, 3.0, dtype=np.float32)
    d_x, d_y = cuda.to_device(x), cuda.to_device(y)
    d_out = cuda.device_array_like(x)
    saxpy[(n + 255) // 256, 256](np.float32(2.0), d_x, d_y, d_out)
    out = d_out.copy_to_host()
    if not np.array_equal(out, 2.0 * x + y):
        failures.append("saxpy differs from numpy")

    sizes = [1, 1000, 65_536, 1 << 20, 3 << 20]
    for i in range(200):
        m = sizes[i % len(sizes)]
        d = cuda.device_array(m, dtype=np.int64)
        iota_plus[(m + 255) // 256, 256](i, d)
        h = d.copy_to_host()
        if h[0] != i or h[-1] != m - 1 + i:
            failures.append(f"array of {m} holds wrong data")
            break
        del d
        flush_pending_frees()

    print(f"RESULT saxpy sum {float(out.sum(dtype=np.float64))!r}")
    for msg in failures:
        print(f"  {msg}")
    print(f"numba_client: {'FAIL' if failures else 'PASS'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
