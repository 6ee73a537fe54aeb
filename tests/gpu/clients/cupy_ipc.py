#!/usr/bin/env python3
"""cupy_ipc.py — CUDA IPC of CuPy arrays to a spawned process.

With cupy.cuda.set_allocator(None) every array is its own cudaMalloc, so
under cachalloc the small arrays here share one segment.  The parent fills
six arrays of mixed sizes and dtypes (64 B .. 3 MiB) from NumPy, exports each
with cupy.cuda.runtime.ipcGetMemHandle and starts a process with
multiprocessing's 'spawn' method (it inherits the environment, LD_PRELOAD
included), which opens every handle with ipcOpenMemHandle, copies each array
to the host, compares every element with what NumPy computes there, prints
`cupy_ipc child: OK` or the mismatches, and closes the handles.  The parent
then checks its arrays are unchanged and allocates and frees more (so a
cache has something to reuse).  Prints `cupy_ipc: PASS` when the child
printed OK and exited 0; exit 1 on any mismatch, 77 without cupy or GPU.
"""
import multiprocessing as mp
import sys

import numpy as np

try:
    import cupy as cp
except ImportError:
    print("cupy_ipc: SKIP (cupy not installed)")
    sys.exit(77)

# (dtype, elements): 64 B .. about 3 MiB.
ARRAYS = [("uint8", 64), ("int32", 250), ("float32", 1003), ("int64", 12_345),
          ("float64", 131_072), ("int32", 786_435)]


def expected(k, dtype, n):
    """What array k holds: distinct per array and per element."""
    i = np.arange(n, dtype=np.int64)
    if np.dtype(dtype).kind == "f":
        return (i * 0.5 + k * 1000.25).astype(dtype)
    return ((i * (2 * k + 3) + k * 7919) % np.iinfo(dtype).max).astype(dtype)


def child(specs, queue):
    """Runs in the spawned process: opens, checks, reports."""
    problems = []
    opened = []
    try:
        cp.cuda.set_allocator(None)
        for k, (handle, dtype, n) in enumerate(specs):
            ptr = cp.cuda.runtime.ipcOpenMemHandle(handle)  # cudaIpcMemLazyEnablePeerAccess
            opened.append(ptr)
            nbytes = n * np.dtype(dtype).itemsize
            mem = cp.cuda.UnownedMemory(ptr, nbytes, opened)
            arr = cp.ndarray((n,), dtype=dtype, memptr=cp.cuda.MemoryPointer(mem, 0))
            got = arr.get()
            want = expected(k, dtype, n)
            bad = np.flatnonzero(got != want)
            if bad.size:
                j = int(bad[0])
                problems.append(f"array {k} ({dtype} x {n}): {bad.size} elements differ, first [{j}] "
                                f"= {got[j]!r}, expected {want[j]!r}")
        cp.cuda.runtime.deviceSynchronize()
    except Exception as e:  # CUDARuntimeError from an open, anything else
        problems.append(f"{type(e).__name__}: {e}")
    finally:
        for ptr in opened:
            try:
                cp.cuda.runtime.ipcCloseMemHandle(ptr)
            except Exception as e:
                problems.append(f"ipcCloseMemHandle: {e}")
    for p in problems:
        print(f"  child: {p}", flush=True)
    if not problems:
        print("cupy_ipc child: OK", flush=True)
    queue.put(problems)
    sys.exit(1 if problems else 0)


def main():
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no device")
    except Exception as e:  # CUDARuntimeError when there is no driver
        print(f"cupy_ipc: SKIP (no CUDA device: {e})")
        return 77
    cp.cuda.set_allocator(None)
    failures = []
    arrays, specs = [], []
    for k, (dtype, n) in enumerate(ARRAYS):
        a = cp.asarray(expected(k, dtype, n))
        arrays.append(a)
        specs.append((cp.cuda.runtime.ipcGetMemHandle(a.data.ptr), dtype, n))
    cp.cuda.runtime.deviceSynchronize()

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=child, args=(specs, queue))
    proc.start()
    try:
        problems = queue.get(timeout=120)
    except Exception:  # queue.Empty: the child died or hung
        problems = ["the child sent no result within 120 s"]
    proc.join(timeout=60)
    if proc.is_alive():
        proc.kill()
        proc.join()
        problems.append("the child did not exit")
    elif proc.exitcode != 0:
        problems.append(f"the child exited with {proc.exitcode}")
    failures += problems

    for k, (dtype, n) in enumerate(ARRAYS):
        if not np.array_equal(arrays[k].get(), expected(k, dtype, n)):
            failures.append(f"the parent's array {k} changed while exported")
    checksum = sum(float(a.astype(cp.float64).sum()) for a in arrays)
    del arrays
    # Short-lived arrays after the exports: a cache reuses their blocks.
    for i in range(100):
        n = [16, 1000, 70_000, 1 << 20][i % 4]
        x = cp.full(n, i, dtype=cp.int32)
        if int(x.sum()) != i * n:
            failures.append(f"short-lived array {i} holds wrong data")
            break
        del x

    print(f"RESULT exported checksum {checksum!r}")
    for f in failures:
        print(f"  {f}")
    print(f"cupy_ipc: {'FAIL' if failures else 'PASS'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
