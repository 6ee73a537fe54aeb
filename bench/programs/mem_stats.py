#!/usr/bin/env python3
"""mem_stats.py — runs one program of bench/programs unchanged and prints, when
it ends, PyTorch's own memory figures for the whole run (bench/record-traces.sh,
bench/memory_report.py):

    mem_stats.py --name NAME [--setting LABEL] -- SCRIPT.py [ARGS...]

prints as its last line

    TORCH_MEMORY_STATS {"program": NAME, "setting": LABEL, "alloc_conf": ...,
                        "caching": true|false, "stats": {key: value, ...}}

with the peaks and counters of torch.cuda.memory_stats(device) that the memory
table needs (allocated/reserved/active/requested bytes, segments, retries,
OOMs, device allocations).  torch.cuda.reset_peak_memory_stats() is made a
no-op for the run, so the peaks cover every step, as a trace does.  Under
cachalloc (PYTORCH_NO_CUDA_MEMORY_CACHING=1) PyTorch's own statistics are
empty; the line is still printed, with "caching": false.  The program's exit
status is kept.
"""
import argparse
import json
import os
import runpy
import sys

KEYS = [
    "allocated_bytes.all.peak", "reserved_bytes.all.peak", "active_bytes.all.peak",
    "requested_bytes.all.peak", "inactive_split_bytes.all.peak",
    "allocated_bytes.all.current", "reserved_bytes.all.current",
    "segment.all.peak", "allocation.all.allocated", "num_alloc_retries", "num_ooms",
    "num_device_alloc", "num_device_free", "num_sync_all_streams",
    "oversize_allocations.peak", "oversize_segments.peak",
]


def report(name, setting, device):
    try:
        import torch
    except ImportError:
        return
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return
        torch.cuda.synchronize(device)
        stats = torch.cuda.memory_stats(device)
    except Exception as e:  # a failed program must still end normally
        print(f"mem_stats: no statistics ({type(e).__name__}: {e})", file=sys.stderr)
        return
    line = {"program": name, "setting": setting,
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
            "caching": os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", "") not in ("1", "true", "True"),
            "torch": torch.__version__, "device": device,
            "stats": {k: int(stats[k]) for k in KEYS if k in stats}}
    print("TORCH_MEMORY_STATS " + json.dumps(line, sort_keys=True), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--setting", default="")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("script")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    try:
        import torch

        torch.cuda.reset_peak_memory_stats = lambda *_, **__: None
    except ImportError:
        pass
    sys.argv = [a.script] + args
    sys.path.insert(0, os.path.dirname(os.path.abspath(a.script)))
    code = 0
    try:
        runpy.run_path(a.script, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    report(a.name, a.setting, a.device)
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
