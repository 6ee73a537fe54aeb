#!/usr/bin/env python3
"""torch_train_step.py — a small conv + MLP training run with fixed seeds.

Run with PYTORCH_NO_CUDA_MEMORY_CACHING=1, so every tensor is one
cuMemAlloc_v2/cuMemFree_v2 (PyTorch's own cache is off), once bare and once
under libcachalloc.so: run_clients.py requires the RESULT lines (losses and a
parameter checksum, printed with full precision and as float.hex) to be
identical.  Deterministic algorithms, no TF32.  Exit 77 without torch or GPU.
"""
import os
import sys

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    print("torch_train_step: SKIP (torch not installed)")
    sys.exit(77)

STEPS = 8


def make_model():
    # The wide layer (8192 x 2048 floats, 64 MiB) puts weights, grads and
    # momentum in cachalloc's large pool; activations go to the small one.
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1, stride=2), nn.ReLU(),
        nn.Flatten(),
        nn.Linear(32 * 16 * 16, 2048), nn.ReLU(),
        nn.Linear(2048, 10))


def main():
    if not torch.cuda.is_available():
        print("torch_train_step: SKIP (no CUDA device)")
        return 77
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    model = make_model().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 3, 32, 32, generator=gen).cuda()
    y = torch.randint(0, 10, (64,), generator=gen).cuda()

    losses = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        value = loss.item()
        losses.append(value)
        print(f"RESULT step {step} loss {value!r} {value.hex()}")
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"RESULT parameter checksum {checksum!r} {checksum.hex()}")

    ok = all(v == v and abs(v) != float("inf") for v in losses) and losses[-1] < losses[0]
    print(f"torch_train_step: {'PASS' if ok else 'FAIL'} (loss {losses[0]:.6f} -> {losses[-1]:.6f})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
