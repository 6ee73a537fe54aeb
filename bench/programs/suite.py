#!/usr/bin/env python3
"""suite.py — the one-GPU programs in ONE process, one after the other, so
that a run pays Python's and torch's start-up once:

    suite.py [--phases train,hf,side] [--steps N] [--hf-steps N] [--warmup N] [--quick]

Phases (each printed exactly as its standalone script prints it):
  train  train_varlen.py                (program "train_varlen")
  hf     hf_gpt.py                      (program "hf_gpt2"; skipped with a
                                         RESULT saying why when transformers
                                         cannot be imported)
  side   train_varlen.py --side-stream  (program "train_varlen_side")
The side phase creates a non-blocking stream that lives until the process
ends (torch never destroys its streams), so it runs last: the phases before
it see a process with no stream but the legacy one, as their standalone
scripts do.  Between phases every tensor is dropped and both caches emptied
(torch.cuda.empty_cache, cachalloc_empty_cache(-1) when cachalloc is
preloaded); the device peak is reset, so each phase reports its own.
"""
import argparse
import ctypes
import gc
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import hf_gpt  # noqa: E402
import train_varlen  # noqa: E402


def empty_caches():
    import torch

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    # cachalloc's peaks too: without this a phase reported the peaks of the
    # phases before it (hf_gpt2's deferred_free_bytes.peak of 5.5 GB was
    # train_varlen's, far above hf_gpt2's own device peak).
    for name in ("cachalloc_empty_cache", "cachalloc_reset_peak_stats"):
        try:
            fn = getattr(ctypes.CDLL(None), name)
            fn.argtypes = [ctypes.c_int]
            fn(-1)
        except (OSError, AttributeError):
            pass
    try:
        torch.cuda.reset_peak_memory_stats()
    except Exception:  # not every allocator keeps statistics
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    train_varlen.add_args(ap)
    ap.add_argument("--phases", default="train,hf,side")
    ap.add_argument("--hf-steps", type=int, default=None)
    ap.add_argument("--gen-tokens", type=int, default=24)
    args = ap.parse_args()
    torch = common.import_torch("suite")
    if torch is None:
        return 77
    sampler, counters = common.start_measuring(torch, args.device)
    rc = 0
    for phase in [p.strip() for p in args.phases.split(",") if p.strip()]:
        empty_caches()
        sampler.reset()
        try:
            if phase in ("train", "side"):
                result = train_varlen.run(args, phase == "side", sampler, counters if counters.available else None)
            elif phase == "hf":
                _, why = hf_gpt.import_transformers()
                if why:
                    print(f"suite: hf phase skipped (transformers not importable: {why})")
                    common.skip("hf_gpt2", f"transformers not importable: {why}")
                    continue
                hf_args = argparse.Namespace(steps=args.hf_steps or args.steps, warmup=args.warmup, seed=args.seed,
                                             gen_tokens=args.gen_tokens, device=args.device)
                result = hf_gpt.run(hf_args, sampler, counters if counters.available else None)
            else:
                print(f"suite: unknown phase {phase!r}")
                rc = 2
                continue
        except Exception as e:
            traceback.print_exc()
            common.emit({"program": {"train": "train_varlen", "side": "train_varlen_side", "hf": "hf_gpt2"}.get(
                phase, phase), "ok": False, "error": f"{type(e).__name__}: {e}"})
            rc = 1
            continue
        torch.cuda.synchronize()
        result["peak"] = {"bytes": sampler.peak(), "baseline_bytes": sampler.baseline, "source": sampler.source,
                          "note": sampler.note}
        common.emit(result)
        if not result["ok"]:
            rc = 1
    sampler.stop()
    return rc


if __name__ == "__main__":
    sys.exit(main())
