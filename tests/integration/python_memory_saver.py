#!/usr/bin/env python3
"""python_memory_saver.py — cachalloc's tags from Python, and the
torch_memory_saver drop-in (cachalloc.memory_saver), against the fake
libcuda.so.1 through the pluggable ABI (cachalloc_malloc), no torch needed.

Usage: python_memory_saver.py MODULE_DIR LIBCACHALLOC
"""
import ctypes
import sys

MiB = 1 << 20


def check(cond, what):
    if not cond:
        print(f"python_memory_saver: FAIL: {what}")
        sys.exit(1)


def main():
    sys.path.insert(0, sys.argv[1])
    import cachalloc
    from cachalloc.memory_saver import torch_memory_saver as tms

    cuda = ctypes.CDLL("libcuda.so.1")
    check(cuda.cuInit(0) == 0, "cuInit")
    ctx = ctypes.c_void_p()
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0, "retain")
    check(cuda.cuCtxSetCurrent(ctx) == 0, "set current")
    cuda.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
    cuda.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
    lib = cachalloc.load()

    def alloc(n):
        p = lib.cachalloc_malloc(n, 0, None)
        check(p, "cachalloc_malloc")
        return p

    check(cachalloc.get_tag() == "", "untagged at start")
    with tms.region("weights", enable_cpu_backup=True):
        check(cachalloc.get_tag() == "weights", "region sets the tag")
        w = alloc(30 * MiB)
        with tms.disable():
            check(cachalloc.get_tag() == "", "disable() untags")
            u = alloc(1 * MiB)
    with cachalloc.region("kv_cache"):
        k = alloc(20 * MiB)
    check(cachalloc.get_tag() == "", "untagged after the regions")
    data = bytes(range(256)) * (30 * MiB // 256)
    check(cuda.cuMemcpyHtoD_v2(w, data, len(data)) == 0, "write weights")

    tms.pause("kv_cache")
    tms.pause("weights")
    tms.pause("weights")  # a no-op (warning), no exit
    check(cachalloc.tag_paused("weights") and cachalloc.tag_paused("kv_cache"), "paused")
    tags = cachalloc.stats()["devices"][0]["tags"]
    check(tags["weights"]["paused_bytes"] >= 30 * MiB and tags["weights"]["backup_bytes"] >= 30 * MiB,
          "per-tag statistics while paused")
    with tms.region("weights"):
        check(lib.cachalloc_malloc(1000, 0, None) is None, "allocation in a paused tag refused")
    tms.resume()
    check(not cachalloc.tag_paused("weights"), "resumed")
    back = ctypes.create_string_buffer(len(data))
    check(cuda.cuMemcpyDtoH_v2(back, w, len(data)) == 0, "read weights")
    check(back.raw == data, "weights restored at the same address")
    tags = cachalloc.stats()["devices"][0]["tags"]
    check(tags["weights"]["num_pauses"] == 1 and tags["weights"]["num_resumes"] == 1, "counts")
    try:
        cachalloc.pause("")
        check(False, "pausing the untagged memory must fail")
    except cachalloc.CachallocError as e:
        check(e.code == 1, "CachallocError(INVALID_VALUE)")
    for p in (w, u, k):
        lib.cachalloc_free(p, 0, 0, None)
    disk_backups(cachalloc, tms, cuda, alloc, lib)
    print("python_memory_saver: PASS")


def disk_backups(cachalloc, tms, cuda, alloc, lib):
    """enable_disk_backup / cpu_backup="disk": the backup goes to a file,
    with no warning (it used to fall back to host memory with one)."""
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with tms.region("big", enable_disk_backup=True):
            b = alloc(24 * MiB)
    check(not caught, f"enable_disk_backup warns no more: {[str(c.message) for c in caught]}")
    with cachalloc.region("big2", cpu_backup="disk"):
        b2 = alloc(3 * MiB)
    data = bytes(reversed(range(256))) * (24 * MiB // 256)
    check(cuda.cuMemcpyHtoD_v2(b, data, len(data)) == 0, "write big")
    check(cuda.cuMemcpyHtoD_v2(b2, data, 3 * MiB) == 0, "write big2")
    tms.pause("big")
    cachalloc.pause("big2")
    tags = cachalloc.stats()["devices"][0]["tags"]
    for name, size in (("big", 24 * MiB), ("big2", 3 * MiB)):
        t = tags[name]
        check(t["backup_mode"] == "disk" and t["backup_location"] == "disk", f"{name}: a disk backup: {t}")
        check(t["backup_disk_bytes"] >= size and t["backup_bytes"] == t["backup_disk_bytes"], f"{name}: disk bytes {t}")
        check(t["backup_capacity_bytes"] == 0, f"{name}: no host buffer of the tag's size")
        check(0 < t["backup_staging_bytes"] <= 128 * MiB, f"{name}: staging only {t}")
    summary = cachalloc.memory_summary(0)
    check("disk backups stage through" in summary and " disk " in summary, f"memory_summary: where and staging\n{summary}")
    tms.resume()
    back = ctypes.create_string_buffer(len(data))
    check(cuda.cuMemcpyDtoH_v2(back, b, len(data)) == 0, "read big")
    check(back.raw == data, "big restored from its file")
    check(cuda.cuMemcpyDtoH_v2(back, b2, 3 * MiB) == 0, "read big2")
    check(back.raw[:3 * MiB] == data[:3 * MiB], "big2 restored from its file")
    check(cachalloc.stats()["devices"][0]["tags"]["big"]["backup_disk_bytes"] == 0, "the file went at the resume")
    try:
        cachalloc.set_tag_backup("big", "tape")
        check(False, "an unknown backup mode must fail")
    except cachalloc.CachallocError as e:
        check(e.code == 1, "CachallocError(INVALID_VALUE) for a bad mode")
    for p in (b, b2):
        lib.cachalloc_free(p, 0, 0, None)


main()
