#!/usr/bin/env python3
"""pause_rl_loop.py — an RL-style train/infer alternation on one GPU through
cachalloc's tags (docs/PAUSE.md), the GPU half of issue 20.

    python3 tests/gpu/clients/pause_rl_loop.py --shim build-gpu/shim/libcachalloc.so \
        --module-dir build-gpu/python [--iters 20] [--weights-gib 1] [--kv-gib 2]

The parent runs the loop in child processes, one per mode:
  preload    LD_PRELOAD=libcachalloc.so, PYTORCH_NO_CUDA_MEMORY_CACHING=1
  pluggable  cachalloc.use_with_torch() (PyTorch's pluggable allocator)
and then the driver's floor (cuMemCreate+cuMemMap+cuMemSetAccess and
cuMemUnmap+cuMemRelease of the same bytes through ctypes, no cachalloc).

Each child: a model's weights under tag "weights" (with a CPU backup, or
with --backup disk a file) and a KV-cache-like pool under "kv_cache"
(none); a CUDA graph captured once that
reads the weights and writes and reads the pool.  First a reference run of
N iterations that never pauses; then N alternations of "pause both, run a
second model in the freed memory, resume both, replay the graph".  Checks:
outputs bit-identical to the reference, NVML used memory after each pause
<= (used before the pause - tagged bytes) + 2% of used before, addresses
unchanged.  Prints per mode a line

    PASS preload: 20 alternations bit-identical; NVML after pause ...; pause X ms/GiB, resume Y ms/GiB

and "FLOOR: map X ms/GiB, unmap Y ms/GiB"; exit 0 when every mode passed.
torch_memory_saver is not installed on the GPU machine (no network), so the
comparison is against the driver's floor.
"""

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time


def nvml_used():
    """Device 0's used memory (NVML), bytes; None without NVML."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None

    class Mem(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    if nvml.nvmlInit_v2() != 0:
        return None
    handle = ctypes.c_void_p()
    if nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)) != 0:
        return None
    mem = Mem()
    if nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)) != 0:
        return None
    return mem.used


def child(args):
    sys.path.insert(0, args.module_dir)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import cachalloc
    if args.mode == "pluggable":
        cachalloc.use_with_torch(args.shim)
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.use_deterministic_algorithms(True)
    dev = torch.device("cuda", 0)
    torch.cuda.init()
    d = 4096
    gen = torch.Generator(device="cpu").manual_seed(1234)
    inputs = [torch.randn(64, d, generator=gen) for _ in range(args.iters)]
    # Untagged: the graph's static buffers.
    x = torch.zeros(64, d, device=dev)
    h = torch.zeros(64, d, device=dev)
    y = torch.zeros(64, d, device=dev)
    torch.cuda.synchronize()
    base = nvml_used()

    layers = max(1, int(args.weights_gib * (1 << 30) / (d * d * 4)))
    with cachalloc.region("weights", cpu_backup="disk" if args.backup == "disk" else True):
        weights = [(torch.randn(d, d, generator=gen) / d ** 0.5).to(dev) for _ in range(layers)]
    kv_rows = int(args.kv_gib * (1 << 30) / (d * 4))
    with cachalloc.region("kv_cache"):
        kv = torch.zeros(kv_rows, d, device=dev)
    slot = kv[kv_rows - 64:]  # the graph writes and reads the pool's end
    addresses = [w.data_ptr() for w in weights] + [kv.data_ptr()]
    torch.cuda.synchronize()

    def step():
        h.copy_(x)
        for w in weights:
            torch.mm(h, w, out=y)
            torch.relu_(y)
            h.copy_(y)
        slot.copy_(h)
        torch.mm(slot, weights[0], out=y)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm-up (cuBLAS handles and workspaces)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):  # the warmed-up stream: no allocation inside the capture
        step()

    def run(i):
        x.copy_(inputs[i])
        graph.replay()
        return y.cpu()

    reference = [run(i) for i in range(args.iters)]
    before = nvml_used()
    tagged = sum(w.numel() * 4 for w in weights) + kv.numel() * 4
    pause_s, resume_s, worst_after, mismatches = [], [], 0, 0
    for i in range(args.iters):
        t0 = time.perf_counter()
        cachalloc.pause("kv_cache")
        cachalloc.pause("weights")
        pause_s.append(time.perf_counter() - t0)
        after = nvml_used()
        if after is not None:
            worst_after = max(worst_after, after)
        # The second model, in the freed memory (untagged), then given back.
        other = torch.randn(int(tagged * 0.8) // (d * 4), d, device=dev)
        other.mul_(2.0).sum().item()
        del other
        cachalloc.empty_cache()
        t0 = time.perf_counter()
        cachalloc.resume("weights")
        cachalloc.resume("kv_cache")
        resume_s.append(time.perf_counter() - t0)
        out = run(i)
        if not torch.equal(out, reference[i]):
            mismatches += 1
    same_addresses = addresses == [w.data_ptr() for w in weights] + [kv.data_ptr()]
    gib = tagged / (1 << 30)
    tags = cachalloc.stats().get("devices", [{}])[0].get("tags", {})
    # After a pause NVML may show the untagged memory (before - tagged) plus 2% of what it was.
    limit = None if before is None else before - tagged + 0.02 * before
    ok_nvml = limit is None or worst_after <= limit
    fig = (f"{args.iters} alternations, {mismatches} mismatches; tagged {gib:.2f} GiB; "
           f"NVML used MiB: base {base and base >> 20}, before pause {before and before >> 20}, "
           f"worst after pause {worst_after >> 20} (limit {int(limit or 0) >> 20}); "
           f"pause {1e3 * sorted(pause_s)[len(pause_s) // 2] / gib:.1f} ms/GiB, "
           f"resume {1e3 * sorted(resume_s)[len(resume_s) // 2] / gib:.1f} ms/GiB (medians, "
           + (f"disk backup through {tags.get('weights', {}).get('backup_staging_bytes', 0) >> 20} MiB of staging"
              if args.backup == "disk" else
              f"backup of {tags.get('weights', {}).get('backup_capacity_bytes', 0) >> 20} MiB")
           + " included)")
    ok = mismatches == 0 and same_addresses and ok_nvml and tags.get("weights", {}).get("num_pauses") == args.iters
    print(("PASS " if ok else "FAIL ") + f"{args.mode}: " + fig + ("" if same_addresses else "; ADDRESSES MOVED"))
    print("RESULT " + json.dumps({"mode": args.mode, "ok": ok, "gib": gib, "pause_s": pause_s, "resume_s": resume_s,
                                  "nvml": [base, before, worst_after], "tags": tags}))
    sys.stdout.flush()
    return 0 if ok else 1


def floor(gib):
    """cuMemCreate+cuMemMap+cuMemSetAccess then cuMemUnmap+cuMemRelease of
    `gib` GiB in 20 MiB pages (cachalloc's large-pool page), through ctypes."""
    cu = ctypes.CDLL("libcuda.so.1")
    assert cu.cuInit(0) == 0
    dev = ctypes.c_int()
    cu.cuDeviceGet(ctypes.byref(dev), 0)
    ctx = ctypes.c_void_p()
    cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    cu.cuCtxSetCurrent(ctx)

    class Loc(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]

    class Prop(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", Loc),
                    ("win32HandleMetaData", ctypes.c_void_p), ("compressionType", ctypes.c_ubyte),
                    ("gpuDirectRDMACapable", ctypes.c_ubyte), ("usage", ctypes.c_ushort),
                    ("reserved", ctypes.c_ubyte * 4)]

    class Access(ctypes.Structure):
        _fields_ = [("location", Loc), ("flags", ctypes.c_int)]

    page = 20 << 20
    n = int(gib * (1 << 30)) // page
    prop = Prop(type=1, requestedHandleTypes=0, location=Loc(1, dev.value))  # pinned, device
    acc = Access(location=Loc(1, dev.value), flags=3)
    base = ctypes.c_ulonglong()
    assert cu.cuMemAddressReserve(ctypes.byref(base), ctypes.c_size_t(n * page), ctypes.c_size_t(0),
                                  ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)) == 0
    maps, unmaps = [], []
    for _ in range(3):
        handles = []
        t0 = time.perf_counter()
        for i in range(n):
            h = ctypes.c_ulonglong()
            assert cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(page), ctypes.byref(prop), ctypes.c_ulonglong(0)) == 0
            at = ctypes.c_ulonglong(base.value + i * page)
            assert cu.cuMemMap(at, ctypes.c_size_t(page), ctypes.c_size_t(0), h, ctypes.c_ulonglong(0)) == 0
            assert cu.cuMemSetAccess(at, ctypes.c_size_t(page), ctypes.byref(acc), ctypes.c_size_t(1)) == 0
            handles.append(h)
        maps.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for i, h in enumerate(handles):
            assert cu.cuMemUnmap(ctypes.c_ulonglong(base.value + i * page), ctypes.c_size_t(page)) == 0
            assert cu.cuMemRelease(h) == 0
        unmaps.append(time.perf_counter() - t0)
    cu.cuMemAddressFree(base, ctypes.c_size_t(n * page))
    g = n * page / (1 << 30)
    print(f"FLOOR: map {1e3 * min(maps) / g:.1f} ms/GiB, unmap {1e3 * min(unmaps) / g:.1f} ms/GiB "
          f"({n} pages of 20 MiB, best of 3, driver calls only)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shim", required=True)
    ap.add_argument("--module-dir", required=True)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--weights-gib", type=float, default=1.0)
    ap.add_argument("--kv-gib", type=float, default=2.0)
    ap.add_argument("--modes", default="preload,pluggable")
    ap.add_argument("--backup", choices=["host", "disk"], default="host",
                    help="where the weights' backup goes at each pause (disk: CACHALLOC_CONF's pause_backup_dir)")
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--floor", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mode:
        return child(args)
    if args.floor:
        floor(args.weights_gib + args.kv_gib)
        return 0
    failed = 0
    base_cmd = [sys.executable, os.path.abspath(__file__), "--shim", args.shim, "--module-dir", args.module_dir,
                "--iters", str(args.iters), "--weights-gib", str(args.weights_gib), "--kv-gib", str(args.kv_gib),
                "--backup", args.backup]
    # Within gpu-check's 70 s: LD_PRELOAD first, then the driver's floor,
    # then the pluggable allocator; both modes must pass.
    modes = args.modes.split(",")
    order = [m for m in modes if m == "preload"] + ["floor"] + [m for m in modes if m != "preload"]
    for mode in order:
        if mode == "floor":
            try:
                if subprocess.run(base_cmd + ["--floor"], timeout=10).returncode != 0:
                    print("FLOOR: failed")
            except subprocess.TimeoutExpired:
                print("FLOOR: timeout")
            continue
        env = dict(os.environ)
        if mode == "preload":
            env.update(LD_PRELOAD=args.shim, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
        try:
            rc = subprocess.run(base_cmd + ["--mode", mode], env=env, timeout=32).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        if rc != 0:
            print(f"FAIL {mode}: exit {rc}")
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
