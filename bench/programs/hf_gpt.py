#!/usr/bin/env python3
"""hf_gpt.py — a HuggingFace transformers model with random weights from a
small GPT-2 config (nothing downloaded): a few training steps with batch and
sequence length changing every step, then greedy generation.

    hf_gpt.py [--steps N] [--warmup N] [--seed S] [--gen-tokens N]

Eager attention, no dropout, fixed seeds, deterministic kernels: losses and
generated tokens compare bit for bit across allocators.  Prints LOSS /
STEP_MS / PEAK / RESULT lines (common.py; RESULT also has "tokens", the
generated ids, and "gen_ms").  Exit 77 without torch, transformers or a GPU.
"""
import argparse
import math
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def add_args(ap):
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gen-tokens", type=int, default=24)
    ap.add_argument("--device", type=int, default=0)


def import_transformers():
    """(module, None) or (None, why)."""
    try:
        import transformers  # noqa: F401
        from transformers import GPT2Config, GPT2LMHeadModel  # noqa: F401
        return transformers, None
    except Exception as e:  # ImportError, or a broken install
        return None, f"{type(e).__name__}: {e}"


def make_model():
    from transformers import GPT2Config, GPT2LMHeadModel

    kw = dict(vocab_size=4096, n_positions=512, n_embd=256, n_layer=4, n_head=4,
              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    try:
        cfg = GPT2Config(attn_implementation="eager", **kw)
    except TypeError:
        cfg = GPT2Config(**kw)
    try:
        cfg._attn_implementation = "eager"
    except Exception:
        pass
    return GPT2LMHeadModel(cfg), cfg


def batch(args, vocab, step, b, t):
    """Sequences with x[i+1] = (7 x[i] + 3) mod vocab from random starts."""
    import torch

    g = torch.Generator().manual_seed(args.seed * 7919 + step)
    x = torch.empty(b, t, dtype=torch.long)
    x[:, 0] = torch.randint(0, vocab, (b,), generator=g)
    for i in range(1, t):
        x[:, i] = (7 * x[:, i - 1] + 3) % vocab
    return x


def run(args, sampler=None, counters=None, name="hf_gpt2"):
    import torch

    dev = torch.device("cuda", args.device)
    torch.cuda.set_device(dev)
    common.determinism(args.seed)
    model, cfg = make_model()
    model = model.to(dev)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rng = random.Random(args.seed + 29)
    plan = [(rng.randint(2, 8), rng.choice(range(32, 257, 16))) for _ in range(args.warmup + args.steps)]
    timer = common.StepTimer()
    losses, values = [], []
    before = None
    for step, (b, t) in enumerate(plan):
        if step == args.warmup:
            timer.reset()
            before = counters.snapshot() if counters is not None else None
        ids = batch(args, cfg.vocab_size, step, b, t)
        with timer:
            ids = ids.to(dev)
            out = model(input_ids=ids, labels=ids)
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            value = out.loss.item()
        if sampler is not None:
            sampler.poll()
        losses.append(value.hex())
        values.append(value)
    model.eval()
    prompt = batch(args, cfg.vocab_size, 10_000, 4, 8).to(dev)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad():
        gen = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt),
                             max_new_tokens=args.gen_tokens, min_new_tokens=args.gen_tokens,
                             do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
    gen_ms = (time.perf_counter() - t0) * 1e3
    after = counters.snapshot() if counters is not None else None
    tokens = gen[:, prompt.shape[1]:].tolist()
    result = {"program": name, "ok": all(math.isfinite(v) for v in values), "steps": args.steps,
              "warmup": args.warmup, "step_ms": timer.times, **timer.host(), "gen_ms": gen_ms, "losses": losses,
              "loss_values": values, "tokens": tokens, "allocator": common.allocator_label(),
              "torch_mem": {"max_reserved": torch.cuda.max_memory_reserved(dev),
                            "max_allocated": torch.cuda.max_memory_allocated(dev)}}
    if before is not None and after is not None:
        result[counters.key] = counters.diff(before, after)
    del model, opt
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_args(ap)
    args = ap.parse_args()
    torch = common.import_torch("hf_gpt")
    if torch is None:
        return 77
    _, why = import_transformers()
    if why:
        print(f"hf_gpt: SKIP (transformers not importable: {why})")
        common.skip("hf_gpt2", f"transformers not importable: {why}")
        return 77
    return common.measure_one(torch, args.device, lambda s, c: run(args, s, c))


if __name__ == "__main__":
    sys.exit(main())
