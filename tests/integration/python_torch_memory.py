#!/usr/bin/env python3
"""python_torch_memory.py — cachalloc.patch_torch() / use_with_torch() on a
stub `torch` module, against the fake libcuda.so.1 (no PyTorch here; the GPU
check runs the same functions under real PyTorch: tests/gpu/torch_memory.py).

Usage: python_torch_memory.py MODULE_DIR LIBCACHALLOC   (FAKE_CUDA_DEVICES=2)

The stub's torch.cuda memory functions raise as PyTorch's do under the
pluggable allocator ("does not yet support getDeviceStats").  After
use_with_torch() every one of them answers, per device and for the current
device when given none, with what cachalloc's own statistics say about the
allocations made through cachalloc_malloc; unpatch_torch() gives them back.
"""
import collections
import os
import sys
import types

MiB = 1 << 20
UNSUPPORTED = "CUDAPluggableAllocator does not yet support getDeviceStats"


def check(cond, what):
    if not cond:
        print(f"python_torch_memory: FAIL: {what}")
        sys.exit(1)


def stub_torch():
    """A torch with PyTorch's names for what cachalloc touches."""
    torch = types.ModuleType("torch")
    cuda = types.ModuleType("torch.cuda")
    memory = types.ModuleType("torch.cuda.memory")
    state = {"device": 0, "allocator": None}

    def unsupported(*args, **kwargs):
        raise RuntimeError(UNSUPPORTED)

    for name in ("memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved",
                 "max_memory_reserved", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
                 "reset_max_memory_allocated", "reset_max_memory_cached", "memory_summary",
                 "memory_snapshot", "_snapshot"):
        setattr(memory, name, unsupported)
        if not name.startswith("_"):
            setattr(cuda, name, unsupported)  # torch.cuda re-exports torch.cuda.memory's

    class Device:
        def __init__(self, spec):
            self.type, _, index = spec.partition(":")
            self.index = int(index) if index else None

    class Native:
        """PyTorch's _CUDAPluggableAllocator: a setter per hook, taking the
        function's address (PyTorch 2.3+); records what it was given."""

        def __init__(self):
            self.hooks = {}
            for setter in ("set_reset_fn", "set_memory_fraction_fn", "set_base_alloc_fn", "set_record_stream_fn",
                           "set_begin_allocate_to_pool", "set_end_allocate_to_pool_fn", "set_release_pool"):
                setattr(self, setter, lambda address, setter=setter: self.hooks.__setitem__(setter, address))

    class CUDAPluggableAllocator:
        def __init__(self, path, alloc_fn, free_fn):
            self.path, self.alloc_fn, self.free_fn = path, alloc_fn, free_fn
            self.native = Native()

        def allocator(self):
            return self.native

    def change_current_allocator(allocator):
        state["allocator"] = allocator

    class MemPool:  # as PyTorch's pluggable wrapper answers a pool
        def __init__(self, *args, **kwargs):
            raise RuntimeError("pluggable does not yet support createOrIncrefPool")

    memory.CUDAPluggableAllocator = CUDAPluggableAllocator
    memory.change_current_allocator = change_current_allocator
    cuda.MemPool = MemPool
    cuda.memory = memory
    cuda.current_device = lambda: state["device"]
    torch.cuda = cuda
    torch.device = Device
    sys.modules.update({"torch": torch, "torch.cuda": cuda, "torch.cuda.memory": memory})
    return torch, state


def main():
    module_dir, lib_path = sys.argv[1], sys.argv[2]
    sys.path.insert(0, module_dir)
    os.environ.pop("CACHALLOC_LIBRARY", None)
    import ctypes

    import cachalloc

    torch, state = stub_torch()
    try:
        torch.cuda.memory_allocated(0)
        check(False, "the stub raises as PyTorch does")
    except RuntimeError as e:
        check(UNSUPPORTED in str(e), "the stub's message")

    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        allocator = cachalloc.use_with_torch(lib_path, oom_error=True)
    # The stub has no torch.utils.cpp_extension: no companion, said once.
    check(state["allocator"] is allocator and allocator.alloc_fn == "cachalloc_malloc", "use_with_torch()")
    check(any("companion could not be built" in str(w.message) for w in caught),
          "use_with_torch(): a warning when the OOM companion cannot be built")
    lib = cachalloc.load()
    hooks = allocator.allocator().hooks
    for setter, symbol in (("set_begin_allocate_to_pool", "cachalloc_pluggable_begin_allocate_to_pool"),
                           ("set_end_allocate_to_pool_fn", "cachalloc_pluggable_end_allocate_to_pool"),
                           ("set_release_pool", "cachalloc_pluggable_release_pool"),
                           ("set_record_stream_fn", "cachalloc_pluggable_record_stream")):
        check(hooks.get(setter) == ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value,
              f"use_with_torch(): {setter} given {symbol}")
    cuda, memory = torch.cuda, torch.cuda.memory

    # torch_memory_saver's regions and disable() in both hook modes: cachalloc
    # is PyTorch's allocator, so no torch.cuda.MemPool (the wrapper refuses
    # one), the tag set on the thread all the same.
    from cachalloc import memory_saver
    from cachalloc.memory_saver import TorchMemorySaver
    for mode in ("preload", "torch"):
        tms = TorchMemorySaver()
        tms.hook_mode = mode
        with tms.region(tag="weights", enable_cpu_backup=True):
            check(memory_saver.get_tag() == "weights", f"hook mode {mode}: a region tags the thread, with no pool")
        with tms.disable():
            check(memory_saver.get_tag() != "weights", f"hook mode {mode}: disable() with no pool")
        check(memory_saver.get_tag() == "", f"hook mode {mode}: untagged after the region")

    # Before anything is served: PyTorch's answers before CUDA is initialized.
    check(cuda.memory_stats() == {} and cuda.memory_allocated() == 0 and cuda.max_memory_reserved(1) == 0,
          "before anything was served")

    # Allocations on two devices through the pluggable ABI, as PyTorch makes them.
    drv = ctypes.CDLL("libcuda.so.1")
    check(drv.cuInit(0) == 0, "cuInit")
    ctx = [ctypes.c_void_p(), ctypes.c_void_p()]
    for d in (0, 1):
        check(drv.cuDevicePrimaryCtxRetain(ctypes.byref(ctx[d]), d) == 0, "retain")
    check(drv.cuCtxSetCurrent(ctx[0]) == 0, "set current")
    lib = cachalloc.load()
    a = lib.cachalloc_malloc(3 * MiB, 0, None)
    b = lib.cachalloc_malloc(5 * MiB, 1, None)
    c = lib.cachalloc_malloc(7 * MiB, 1, None)
    check(a and b and c, "cachalloc_malloc")

    for fn in (cuda.memory_stats, memory.memory_stats):
        s0 = fn(0)
        check(isinstance(s0, collections.OrderedDict) and list(s0) == sorted(s0), "memory_stats: sorted, ordered")
        check(s0 == cachalloc.stats(0), "memory_stats(0) is cachalloc.stats(0)")
        check(s0["allocated_bytes.all.current"] == 3 * MiB and s0["allocation.all.current"] == 1,
              "memory_stats(0): PyTorch's keys, cachalloc's values")
    check(cuda.memory_stats()["allocated_bytes.all.current"] == 3 * MiB, "memory_stats(): the current device")
    check(cuda.memory_allocated() == 3 * MiB, "memory_allocated(): the current device")
    check(cuda.memory_allocated(1) == 12 * MiB, "memory_allocated(1)")
    check(cuda.memory_allocated("cuda:1") == 12 * MiB, "memory_allocated('cuda:1')")
    check(cuda.memory_allocated(torch.device("cuda:1")) == 12 * MiB, "memory_allocated(torch.device)")
    reserved1 = cachalloc.stats(1)["reserved_bytes.all.current"]
    check(cuda.memory_reserved(1) == reserved1 >= 12 * MiB, "memory_reserved(1)")
    state["device"] = 1  # torch.cuda.set_device(1)
    check(cuda.memory_allocated() == 12 * MiB and memory.memory_allocated() == 12 * MiB,
          "memory_allocated() follows the current device")
    check(cuda.max_memory_allocated() == 12 * MiB, "max_memory_allocated()")

    lib.cachalloc_free(c, 7 * MiB, 1, None)
    check(cuda.memory_allocated(1) == 5 * MiB and cuda.max_memory_allocated(1) == 12 * MiB,
          "after a free: current down, peak kept")
    check(cuda.max_memory_reserved(1) == cachalloc.stats(1)["reserved_bytes.all.peak"], "max_memory_reserved(1)")
    cuda.reset_peak_memory_stats()  # the current device, 1
    check(cuda.max_memory_allocated(1) == 5 * MiB, "reset_peak_memory_stats(): device 1's peak")
    check(cuda.max_memory_allocated(0) == 3 * MiB, "reset_peak_memory_stats(): device 0 untouched")
    check(cuda.memory_stats(1)["allocation.all.allocated"] == 2, "accumulated count before the reset")
    memory.reset_accumulated_memory_stats(1)
    check(cuda.memory_stats(1)["allocation.all.allocated"] == 0, "reset_accumulated_memory_stats(1)")
    check(cuda.memory_stats(0)["allocation.all.allocated"] == 1, "reset_accumulated_memory_stats(1): device 0")
    lib.cachalloc_free(b, 5 * MiB, 1, None)
    b = lib.cachalloc_malloc(MiB, 1, None)
    cuda.reset_max_memory_allocated(1)
    check(cuda.max_memory_allocated(1) == MiB, "reset_max_memory_allocated(1)")

    table = cuda.memory_summary()
    check("device ID 1 " in table and "device ID 0 " not in table, "memory_summary(): the current device")
    check("device ID 0 " in cuda.memory_summary(0, abbreviated=True), "memory_summary(0)")

    snap = memory._snapshot()
    check(set(snap) >= {"segments", "device_traces", "allocator_settings"}, "_snapshot(): PyTorch's keys")
    devices = {s["device"] for s in snap["segments"]}
    check(devices == {0, 1}, f"_snapshot(): segments of both devices ({devices})")
    active = sorted(b_["size"] for s in snap["segments"] for b_ in s["blocks"] if b_["state"] == "active_allocated")
    check(active == [MiB, 3 * MiB], f"_snapshot(): the live blocks ({active})")
    total = sum(s["total_size"] for s in snap["segments"])
    check(total == cuda.memory_reserved(0) + cuda.memory_reserved(1), "_snapshot(): segments = reserved bytes")
    check(cuda.memory_snapshot() == snap["segments"], "memory_snapshot()")

    cachalloc.unpatch_torch()
    try:
        cuda.memory_allocated(0)
        check(False, "unpatch_torch() gives PyTorch's function back")
    except RuntimeError:
        pass
    check(len(cachalloc.patch_torch()) >= 20, "patch_torch(): both namespaces")
    check(cuda.memory_allocated(0) == 3 * MiB, "patch_torch() again")
    lib.cachalloc_free(a, 3 * MiB, 0, None)
    lib.cachalloc_free(b, MiB, 1, None)
    print("python_torch_memory: PASS")


if __name__ == "__main__":
    main()
