#!/usr/bin/env python3
"""python_module.py — python/cachalloc.py against the fake libcuda.so.1.

Usage: python_module.py MODULE_DIR LIBCACHALLOC   (FAKE_CUDA_DEVICES=2)

MODULE_DIR holds the configured cachalloc.py (build/python), which knows the
build's library; LIBCACHALLOC is that library.  Nothing is preloaded: the
module loads the library with ctypes, as PyTorch does.  The device
allocations are made through the pluggable ABI (cachalloc_malloc) with the
fake driver's primary contexts; then stats(), memory_summary(),
empty_cache() and the rest of the module are checked.  Exit 77 (skip)
without ctypes.
"""
import json
import os
import sys
import tempfile

try:
    import ctypes
    import ctypes.util
except ImportError:
    print("python_module: SKIP (no ctypes)")
    sys.exit(77)

MiB = 1 << 20


def check(cond, what):
    if not cond:
        print(f"python_module: FAIL: {what}")
        sys.exit(1)


def main():
    module_dir, lib_path = sys.argv[1], sys.argv[2]
    sys.path.insert(0, module_dir)
    os.environ.pop("CACHALLOC_LIBRARY", None)
    import cachalloc

    # The configured copy finds the build's library by itself.
    check(os.path.realpath(cachalloc.library_path()) == os.path.realpath(lib_path), "library_path()")
    check(not cachalloc.is_loaded(), "nothing loaded before use")

    # Before anything was served: empty, and no error.
    check(cachalloc.stats() == {}, "stats() before use")
    check(cachalloc.stats(0) == {}, "stats(0) before use")
    check("no allocation" in cachalloc.memory_summary(), "memory_summary() before use")
    cachalloc.empty_cache()
    cachalloc.reset_peak_memory_stats()
    check(cachalloc.snapshot(os.path.join(tempfile.gettempdir(), "never.json")) is False, "snapshot() before use")
    check(cachalloc.is_loaded(), "loaded now")

    # The driver, as a ctypes program reaches it.
    cuda = ctypes.CDLL("libcuda.so.1")
    check(cuda.cuInit(0) == 0, "cuInit")
    ctx = [ctypes.c_void_p(), ctypes.c_void_p()]
    for d in (0, 1):
        check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx[d]), d) == 0, "retain")
    check(cuda.cuCtxSetCurrent(ctx[0]) == 0, "set current")

    lib = cachalloc.load()
    a = lib.cachalloc_malloc(3 * MiB, 0, None)
    b = lib.cachalloc_malloc(5 * MiB, 1, None)
    c = lib.cachalloc_malloc(1000, 1, None)
    check(a and b and c, "cachalloc_malloc")

    dump = cachalloc.stats()
    check(dump.get("version") == 1, "stats(): the dump")
    check(sorted(d["device"] for d in dump["devices"]) == [0, 1], "stats(): one entry per device")
    s0, s1 = cachalloc.stats(0), cachalloc.stats("cuda:1")
    check(s0["allocated_bytes.all.current"] == 3 * MiB, "stats(0) allocated")
    check(s1["allocation.all.current"] == 2, "stats('cuda:1') allocations")
    check(s1["allocated_bytes.all.current"] >= 5 * MiB + 1000, "stats('cuda:1') allocated")
    check(cachalloc.stats(5) == {}, "stats() of a device without a cache")

    table = cachalloc.memory_summary(1)
    check("device ID 1 " in table and "Allocated memory" in table and "device ID 0 " not in table,
          "memory_summary(1)")
    full = cachalloc.memory_summary()
    check("device ID 0 " in full and "device ID 1 " in full, "memory_summary()")

    lib.cachalloc_free(a, 3 * MiB, 0, None)
    lib.cachalloc_free(b, 5 * MiB, 1, None)
    lib.cachalloc_free(c, 1000, 1, None)
    check(cachalloc.stats(1)["reserved_bytes.all.current"] > 0, "cached before empty_cache")
    cachalloc.empty_cache(1)
    check(cachalloc.stats(1)["reserved_bytes.all.current"] == 0, "empty_cache(1)")
    check(cachalloc.stats(0)["reserved_bytes.all.current"] > 0, "empty_cache(1) leaves device 0")
    cachalloc.empty_cache(7)  # no cache there: nothing to do
    cachalloc.empty_cache()
    check(cachalloc.stats(0)["reserved_bytes.all.current"] == 0, "empty_cache()")

    cachalloc.reset_peak_memory_stats(0)
    check(cachalloc.stats(0)["allocated_bytes.all.peak"] == 0, "reset_peak_memory_stats(0)")
    cachalloc.reset_accumulated_memory_stats()
    check(cachalloc.stats(1)["allocation.all.allocated"] == 0, "reset_accumulated_memory_stats()")

    cachalloc.set_per_process_memory_fraction(0.5, 1)
    check(cachalloc.get_per_process_memory_fraction(1) == 0.5, "memory fraction")
    check(cachalloc.get_per_process_memory_fraction(0) == 1.0, "memory fraction of another device")
    try:
        cachalloc.set_per_process_memory_fraction(2.0)
        check(False, "fraction 2 refused")
    except cachalloc.CachallocError as e:
        check(e.code == cachalloc.ERROR_INVALID_VALUE, "fraction 2: INVALID_VALUE")

    p = lib.cachalloc_malloc(MiB, 0, None)
    try:
        cachalloc.record_stream(p + 16, None)
        check(False, "record_stream of an interior pointer refused")
    except cachalloc.CachallocError as e:
        check(e.code == cachalloc.ERROR_INVALID_VALUE, "record_stream: INVALID_VALUE")
    cachalloc.validate()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "snap-%r.json")
        check(cachalloc.snapshot(path) is True, "snapshot()")
        with open(os.path.join(d, "snap-0.json")) as f:
            snap = json.load(f)
        check(any(s["blocks"] for dev in snap["devices"] for s in dev["segments"]), "snapshot content")
    lib.cachalloc_free(p, MiB, 0, None)

    # torch is optional here; without it the PyTorch helpers say so.
    try:
        import torch  # noqa: F401
    except ImportError:
        try:
            cachalloc.use_with_torch()
            check(False, "use_with_torch() without torch")
        except ImportError:
            pass

    # One version: the package's (meson's project version) is the library's.
    check(isinstance(cachalloc.__version__, str) and cachalloc.__version__.count(".") == 2,
          f"__version__ {cachalloc.__version__!r}")
    check(cachalloc.library_version() == cachalloc.__version__,
          f"library_version() {cachalloc.library_version()!r} != __version__ {cachalloc.__version__!r}")
    # A library that cannot be found says so first (not "not active").
    saved = (cachalloc._loaded_library_path, cachalloc._CONFIGURED_LIBRARY, ctypes.util.find_library)
    cachalloc._loaded_library_path = lambda: None
    cachalloc._CONFIGURED_LIBRARY = "@unconfigured@"
    ctypes.util.find_library = lambda name: None
    try:
        cachalloc.library_path()
        check(False, "library_path() with no library anywhere")
    except cachalloc.CachallocError as e:
        check(str(e).startswith("library_path: libcachalloc.so not found"), f"the reason said first: {e}")
    finally:
        cachalloc._loaded_library_path, cachalloc._CONFIGURED_LIBRARY, ctypes.util.find_library = saved
    print("python_module: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
