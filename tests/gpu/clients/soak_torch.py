#!/usr/bin/env python3
"""soak_torch.py — a long PyTorch training loop whose shapes change every step.

A small transformer-style model (embedding, two attention + MLP blocks)
trained on random tokens whose batch size and sequence length vary with the
step, so tensors of new sizes are allocated and freed all the time.  Run it
with PYTORCH_NO_CUDA_MEMORY_CACHING=1 (every tensor is one cuMemAlloc_v2 /
cuMemFree_v2) bare and under libcachalloc.so: run_soak.py compares the loss
of every step bit for bit and checks that device memory (NVML) stays flat
after warm-up.

  soak_torch.py --seconds S | --steps N  --out FILE.json

Deterministic algorithms, no TF32, fixed seeds.  Writes {"steps", "losses"
(float.hex), "nvml_used" [[step, bytes], ...], "seconds"}.  Exit 77 without
torch or a GPU.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    print("soak_torch: SKIP (torch not installed)")
    sys.exit(77)

VOCAB, DIM, HEADS = 512, 256, 4


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-1, -2)) / (DIM // HEADS) ** 0.5
        mask = torch.triu(torch.ones(t, t, device=x.device, dtype=torch.bool), 1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, DIM))
        return x + self.mlp(self.ln2(x))


def nvml_used():
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        return lambda: pynvml.nvmlDeviceGetMemoryInfo(h).used
    except Exception:  # noqa: BLE001 - NVML is optional
        return lambda: -1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("soak_torch: SKIP (no CUDA device)")
        return 77
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = nn.Sequential(nn.Embedding(VOCAB, DIM), Block(), Block(), nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    gen = torch.Generator().manual_seed(1)
    used = nvml_used()
    losses, samples = [], []
    start = time.time()
    step = 0
    while (args.steps is not None and step < args.steps) or (args.steps is None and time.time() - start < args.seconds):
        batch, seq = 8 + (step * 7) % 25, 32 + (step * 37) % 225  # new shapes every step
        tokens = torch.randint(0, VOCAB, (batch, seq + 1), generator=gen).cuda()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item().hex())
        if step % 25 == 0:
            torch.cuda.synchronize()
            samples.append([step, used()])
        step += 1
    torch.cuda.synchronize()
    samples.append([step, used()])
    with open(args.out, "w") as f:
        json.dump({"steps": step, "losses": losses, "nvml_used": samples, "seconds": time.time() - start}, f)
    print(f"soak_torch: PASS ({step} steps, loss {float.fromhex(losses[0]):.4f} -> {float.fromhex(losses[-1]):.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
