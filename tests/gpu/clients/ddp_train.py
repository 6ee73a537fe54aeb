#!/usr/bin/env python3
"""ddp_train.py — data-parallel training with NCCL under torchrun, three ways.

    python3 -m torch.distributed.run --nproc-per-node 2 tests/gpu/clients/ddp_train.py --allocator=native
    LD_PRELOAD=build/shim/libcachalloc.so PYTORCH_NO_CUDA_MEMORY_CACHING=1 \\
      CACHALLOC_CONF=stats:/tmp/ddp-%r.json \\
      python3 -m torch.distributed.run --nproc-per-node 2 tests/gpu/clients/ddp_train.py --allocator=preload
    CACHALLOC_CONF=stats:/tmp/ddp-%r.json \\
      python3 -m torch.distributed.run --nproc-per-node 2 tests/gpu/clients/ddp_train.py --allocator=pluggable

  native     PyTorch's own caching allocator
  preload    every tensor a cudaMalloc/cudaFree that cachalloc (preloaded,
             inherited through torchrun) serves: PyTorch's cache must be off
             (PYTORCH_NO_CUDA_MEMORY_CACHING=1) and libcachalloc.so mapped,
             or the rank fails
  pluggable  cachalloc.use_with_torch() before the first CUDA allocation:
             PyTorch's allocator is cachalloc through CUDAPluggableAllocator

Each rank trains the same model (seed 0) on its own batches (seed 100 +
rank) with deterministic kernels; DDP all-reduces the gradients over NCCL,
so the parameters stay identical on every rank.  Per rank it prints
`RESULT rank R step S loss <repr> <hex>` and `RESULT rank R checksum ...`
(the runner compares them across allocators), `TIME rank R ...` (median and
mean step time after warm-up) and `PEAK rank R reserved_bytes N source S`,
then `ddp_train: PASS rank R`.  Exit 77 without torch, CUDA or NCCL.

NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and friends are set unless
already set).  The cachalloc module is found as examples/torch_pluggable.py
finds it (CACHALLOC_PYTHON, an installed cachalloc, the repository's python/).
"""
import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_k, _v)
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))


def import_cachalloc():
    first = os.environ.get("CACHALLOC_PYTHON")
    if first:
        sys.path.insert(0, first)
    try:
        import cachalloc
    except ImportError:
        sys.path.append(os.path.join(REPO, "python"))
        import cachalloc
    return cachalloc


def preloaded_library():
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "libcachalloc.so" in line:
                return line.split()[-1]
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--allocator", choices=["native", "preload", "pluggable"], default="native")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--width", type=int, default=4096, help="hidden width of the MLP")
    args = ap.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        import torch
        import torch.distributed as dist
        import torch.nn as nn
        import torch.nn.functional as F
        from torch.nn.parallel import DistributedDataParallel as DDP
    except ImportError:
        print("ddp_train: SKIP (torch not installed)")
        return 77
    if not torch.cuda.is_available() or not dist.is_nccl_available():
        print("ddp_train: SKIP (no CUDA device or no NCCL)")
        return 77
    if torch.cuda.device_count() <= local_rank:
        print(f"ddp_train: SKIP (rank {rank} needs GPU {local_rank}, {torch.cuda.device_count()} visible)")
        return 77

    cachalloc = None
    if args.allocator == "pluggable":
        cachalloc = import_cachalloc()
        cachalloc.use_with_torch()  # before any CUDA allocation of this rank
    elif args.allocator == "preload":
        lib = preloaded_library()
        if lib is None or os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") != "1":
            print(f"ddp_train: FAIL rank {rank}: preload mode needs libcachalloc.so preloaded ({lib}) and "
                  "PYTORCH_NO_CUDA_MEMORY_CACHING=1")
            return 1
        if os.environ.get("CACHALLOC_PYTHON") or os.path.isfile(os.path.join(REPO, "python", "cachalloc.py")):
            cachalloc = import_cachalloc()  # the preloaded library's statistics, through ctypes

    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    w = args.width
    model = nn.Sequential(nn.Linear(1024, w), nn.GELU(), nn.Linear(w, w), nn.GELU(),
                          nn.Linear(w, w), nn.GELU(), nn.Linear(w, 64)).to(device)
    ddp = DDP(model, device_ids=[local_rank])
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(100 + rank)
    batches = [(torch.randn(512, 1024, generator=gen), torch.randint(0, 64, (512,), generator=gen))
               for _ in range(4)]

    losses, times = [], []
    for step in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        x, y = (t.to(device) for t in batches[step % len(batches)])
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        value = loss.item()  # synchronizes
        times.append(time.perf_counter() - t0)
        losses.append(value)
        del x, y, loss
    # Every rank writes to the same stdout: one flushed write per line, so
    # that lines of two ranks never run into each other (block-buffered
    # output cut lines at buffer boundaries and the comparison saw garbage).
    for step, value in enumerate(losses):
        print(f"RESULT rank {rank} step {step} loss {value!r} {value.hex()}", flush=True)
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"RESULT rank {rank} checksum {checksum!r} {checksum.hex()}", flush=True)
    warm = times[min(args.warmup, len(times) - 1):]
    print(f"TIME rank {rank} allocator {args.allocator} median_step_ms {1000 * statistics.median(warm):.3f} "
          f"mean_step_ms {1000 * statistics.mean(warm):.3f}")

    torch.cuda.synchronize()
    if args.allocator == "native":
        peak, source = torch.cuda.max_memory_reserved(device), "torch.cuda.max_memory_reserved"
    elif cachalloc is not None:
        peak, source = cachalloc.stats(local_rank).get("reserved_bytes.all.peak", -1), "cachalloc.stats"
    else:
        peak, source = -1, "the stats dump"
    print(f"PEAK rank {rank} reserved_bytes {peak} source {source}")

    # Every rank's parameters must be the same after all-reduced updates.
    ref = torch.tensor([checksum], dtype=torch.float64, device=device)
    dist.broadcast(ref, src=0)
    same = ref.item() == checksum
    dist.barrier()
    dist.destroy_process_group()
    ok = same and all(v == v for v in losses) and losses[-1] < losses[0]
    print(f"ddp_train: {'PASS' if ok else 'FAIL'} rank {rank} ({args.allocator}, world {world}, "
          f"parameters {'identical' if same else 'DIFFER'} across ranks)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
