#!/usr/bin/env python3
"""ddp_train.py — train_varlen's model under DistributedDataParallel with
NCCL, one process per GPU, shapes changing every step (the same shapes on
every rank, different data per rank).  Launch with

    python3 -m torch.distributed.run --standalone --nproc-per-node 2 \\
        bench/programs/ddp_train.py [--steps N] [--warmup N] [train_varlen's model options]

Each rank prints LOSS / STEP_MS / PEAK / RESULT lines; RESULT has "rank" and
"world_size"; the loss is the all-reduced mean over ranks (identical on every
rank).  run_bench.py takes step times from rank 0 and the largest peak.
Exit 77 without torch, NCCL or enough GPUs.
"""
import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import train_varlen  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    train_varlen.add_args(ap)
    args = ap.parse_args()
    try:
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
    except ImportError as e:
        print(f"ddp_train: SKIP (torch not importable: {e})")
        return 77
    common.use_pluggable_if_asked()
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if not torch.cuda.is_available() or torch.cuda.device_count() <= local:
        print(f"ddp_train: SKIP (rank {rank}: no CUDA device {local})")
        return 77
    if not dist.is_nccl_available():
        print("ddp_train: SKIP (NCCL not available)")
        return 77
    args.device = local
    sampler = common.PeakSampler(local).start()
    counters = common.allocator_counters()
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    sampler.refine_device()
    try:
        dist.init_process_group("nccl", device_id=dev)
    except TypeError:  # a torch without the device_id argument
        dist.init_process_group("nccl")
    common.determinism(args.seed)
    model = DDP(train_varlen.build_model(args).to(dev), device_ids=[local])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    timer = common.StepTimer()
    losses, values = [], []
    before = None
    total = args.warmup + args.steps
    sampler.reset()
    for step, (b, t) in enumerate(train_varlen.shapes(args, total)):
        if step == args.warmup:
            timer.reset()
            before = counters.snapshot() if counters.available else None
        cpu = train_varlen.batch(args, step * world + rank, b, t)
        with timer:
            idx = cpu.to(dev)
            tgt = (idx * 7 + 3) % args.vocab
            loss = model(idx, tgt)  # through DDP.forward, so its gradient hooks fire
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            value = (mean / world).item()
        sampler.poll()
        losses.append(value.hex())
        values.append(value)
    after = counters.snapshot() if counters.available else None
    torch.cuda.synchronize()
    result = {"program": "ddp_train", "ok": all(math.isfinite(v) for v in values), "rank": rank,
              "world_size": world, "steps": args.steps, "warmup": args.warmup, "step_ms": timer.times, **timer.host(),
              "losses": losses, "loss_values": values, "allocator": common.allocator_label(),
              "torch_mem": {"max_reserved": torch.cuda.max_memory_reserved(dev),
                            "max_allocated": torch.cuda.max_memory_allocated(dev)},
              "peak": {"bytes": sampler.peak(), "baseline_bytes": sampler.baseline, "source": sampler.source}}
    if before is not None and after is not None:
        result[counters.key] = counters.diff(before, after)
    sampler.stop()
    # Rank 0 prints every rank's result: two processes' lines through
    # torchrun's one pipe can interleave mid-line (a run lost a rank so).
    results = [None] * world
    dist.all_gather_object(results, result)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        for r in results:
            common.emit(r)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
