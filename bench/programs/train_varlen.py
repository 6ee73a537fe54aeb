#!/usr/bin/env python3
"""train_varlen.py — a one-GPU transformer training loop whose batch size and
sequence length change every step (a small GPT: token + position embeddings,
pre-norm blocks with hand-written causal attention, AdamW, gradient
clipping), fixed seeds, deterministic kernels, fp32 without TF32.

    train_varlen.py [--steps N] [--warmup N] [--side-stream] [--seed S]
                    [--layers L] [--width C] [--max-seq T] [--max-batch B]

--side-stream: the same math with part of the work on a non-blocking side
stream: the batch's upload, targets and embeddings run there (the main
stream waits for them, record_stream marks their use on main), and the
gradient-norm reduction for clipping runs there after backward (gradients
record_stream'ed to the side stream before zero_grad frees them on main).
Losses therefore equal the plain loop's.

Prints LOSS / STEP_MS / PEAK / RESULT lines (common.py).  Step times are
those of the steps after --warmup; the cachalloc counters cover the same
steps.  Exit 77 without torch or a GPU.
"""
import argparse
import math
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def add_args(ap):
    ap.add_argument("--steps", type=int, default=24, help="timed steps (after --warmup)")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--max-seq", type=int, default=512)
    ap.add_argument("--min-seq", type=int, default=64)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--min-batch", type=int, default=4)
    ap.add_argument("--device", type=int, default=0)


def build_model(args):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Attention(nn.Module):
        def __init__(self, c, h):
            super().__init__()
            self.h = h
            self.qkv = nn.Linear(c, 3 * c)
            self.proj = nn.Linear(c, c)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(x).split(c, dim=2)
            q = q.view(b, t, self.h, c // self.h).transpose(1, 2)
            k = k.view(b, t, self.h, c // self.h).transpose(1, 2)
            v = v.view(b, t, self.h, c // self.h).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.h))
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(b, t, c)
            return self.proj(y)

    class Block(nn.Module):
        def __init__(self, c, h):
            super().__init__()
            self.ln1 = nn.LayerNorm(c)
            self.attn = Attention(c, h)
            self.ln2 = nn.LayerNorm(c)
            self.mlp = nn.Sequential(nn.Linear(c, 4 * c), nn.GELU(), nn.Linear(4 * c, c))

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(args.vocab, args.width)
            self.pos = nn.Embedding(args.max_seq, args.width)
            self.blocks = nn.ModuleList(Block(args.width, args.heads) for _ in range(args.layers))
            self.ln = nn.LayerNorm(args.width)
            self.head = nn.Linear(args.width, args.vocab, bias=False)

        def embed(self, idx):
            pos = torch.arange(idx.shape[1], device=idx.device)
            return self.tok(idx) + self.pos(pos)

        def body(self, x):
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x))

        def loss(self, h0, targets):
            logits = self.body(h0)
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))

        def forward(self, idx, targets):
            return self.loss(self.embed(idx), targets)

    return GPT()


def shapes(args, n):
    """(batch, seq) for n steps: the same sequence for every allocator."""
    rng = random.Random(args.seed + 17)
    seqs = list(range(args.min_seq, args.max_seq + 1, 32)) or [args.max_seq]
    return [(rng.randint(args.min_batch, args.max_batch), rng.choice(seqs)) for _ in range(n)]


def batch(args, step, b, t):
    """A learnable batch on the CPU: the target of token x is (7x + 3) mod vocab."""
    import torch

    g = torch.Generator().manual_seed(args.seed * 100003 + step)
    return torch.randint(0, args.vocab, (b, t), generator=g)


def run(args, side_stream=False, sampler=None, counters=None, name=None):
    import torch

    name = name or ("train_varlen_side" if side_stream else "train_varlen")
    dev = torch.device("cuda", args.device)
    torch.cuda.set_device(dev)
    common.determinism(args.seed)
    model = build_model(args).to(dev)
    params = [p for p in model.parameters()]
    opt = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.01)
    main = torch.cuda.current_stream(dev)
    side = torch.cuda.Stream(dev) if side_stream else None
    timer = common.StepTimer()
    losses, values = [], []
    total = args.warmup + args.steps
    before = None
    for step, (b, t) in enumerate(shapes(args, total)):
        if step == args.warmup:
            timer.reset()
            before = counters.snapshot() if counters is not None else None
        cpu = batch(args, step, b, t)
        with timer:
            if side is None:
                idx = cpu.to(dev)
                tgt = (idx * 7 + 3) % args.vocab
                h0 = model.embed(idx)
            else:
                side.wait_stream(main)  # the parameters were last written on main
                with torch.cuda.stream(side):
                    idx = cpu.to(dev)
                    tgt = (idx * 7 + 3) % args.vocab
                    h0 = model.embed(idx)
                main.wait_stream(side)
                for x in (idx, tgt, h0):
                    x.record_stream(main)
            loss = model.loss(h0, tgt)
            loss.backward()
            if side is None:
                norm = torch.stack([p.grad.norm() for p in params]).norm()
                scale = torch.clamp(1.0 / (norm + 1e-6), max=1.0)
            else:
                side.wait_stream(main)
                with torch.cuda.stream(side):
                    norm = torch.stack([p.grad.norm() for p in params]).norm()
                    scale = torch.clamp(1.0 / (norm + 1e-6), max=1.0)
                main.wait_stream(side)
                scale.record_stream(main)
                # Each gradient is used on both streams and freed on main by
                # zero_grad; which stream allocated it depends on where
                # autograd accumulated it, so both are recorded (recording
                # the allocation stream itself is a no-op).
                for p in params:
                    p.grad.record_stream(side)
                    p.grad.record_stream(main)
            for p in params:
                p.grad.mul_(scale)
            opt.step()
            opt.zero_grad(set_to_none=True)
            value = loss.item()
        if sampler is not None:
            sampler.poll()
        losses.append(value.hex())
        values.append(value)
    after = counters.snapshot() if counters is not None else None
    torch.cuda.synchronize()
    result = {"program": name, "ok": all(math.isfinite(v) for v in values), "steps": args.steps,
              "warmup": args.warmup, "step_ms": timer.times, **timer.host(), "losses": losses, "loss_values": values,
              "allocator": common.allocator_label(),
              "torch_mem": {"max_reserved": torch.cuda.max_memory_reserved(dev),
                            "max_allocated": torch.cuda.max_memory_allocated(dev)}}
    if before is not None and after is not None:
        result[counters.key] = counters.diff(before, after)
    del model, opt, params
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_args(ap)
    ap.add_argument("--side-stream", action="store_true")
    args = ap.parse_args()
    torch = common.import_torch("train_varlen")
    if torch is None:
        return 77
    return common.measure_one(torch, args.device, lambda s, c: run(args, args.side_stream, s, c))


if __name__ == "__main__":
    sys.exit(main())
