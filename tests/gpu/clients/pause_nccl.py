#!/usr/bin/env python3
"""pause_nccl.py — what NCCL does with a tagged buffer after a pause and a
resume at the same addresses (issue 20 item 4, docs/PAUSE.md "Limits"),
measured on two GPUs, one process a GPU, cachalloc by LD_PRELOAD.

    python3 tests/gpu/clients/pause_nccl.py --shim build-gpu/shim/libcachalloc.so \
        --module-dir build-gpu/python [--mib 64]

TMS #88: NCCL registers the buffers a CUDA graph's collectives use
(NCCL_GRAPH_REGISTER, on by default) by importing their physical pages into
the peer; a resume maps *new* pages at the same addresses, so a replayed
graph may read or write the old ones.  Each setting runs both ranks through:

  eager     all_reduce of a tagged buffer; pause(tag), resume(tag), refill,
            all_reduce again
  graph     the same all_reduce captured in a CUDA graph once, replayed
            before the pause and after the resume (refilled in between)

and checks every element (rank r fills r+1, so the sum is 3).  Settings:
NCCL_GRAPH_REGISTER=1 (NCCL's default) and =0 (TMS's workaround).  Prints
one line per setting and case:

    RESULT register=1 eager: correct | wrong (N of M elements, first X) | hang (> T s) | error ...

and a last line "PASS" when eager is correct in both settings and graph
replay is correct with NCCL_GRAPH_REGISTER=0 (what docs/PAUSE.md
promises), whatever register=1 gives (that is the measured behaviour the
docs report); "SKIP" with fewer than two GPUs.
"""

import argparse
import os
import subprocess
import sys
import time


def rank_main(args):
    sys.path.insert(0, args.module_dir)
    import cachalloc
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", device_id=dev)
    n = args.mib * (1 << 20) // 4
    with cachalloc.region("nccl_buf"):
        buf = torch.empty(n, device=dev)
    address = buf.data_ptr()

    def check(case):
        got = buf.cpu()
        bad = int((got != 3.0).sum())
        line = "correct" if bad == 0 else f"wrong ({bad} of {n} elements, first {got[(got != 3.0).nonzero()[0]].item()})"
        if buf.data_ptr() != address:
            line += "; ADDRESS MOVED"
        if rank == 0:
            print(f"RESULT register={os.environ.get('NCCL_GRAPH_REGISTER', 'default')} {case}: {line}", flush=True)

    def pause_resume():
        torch.cuda.synchronize()
        dist.barrier()
        cachalloc.pause("nccl_buf")
        cachalloc.resume("nccl_buf")
        dist.barrier()

    if args.case == "eager":
        buf.fill_(rank + 1)
        dist.all_reduce(buf)
        torch.cuda.synchronize()
        pause_resume()
        buf.fill_(rank + 1)
        dist.all_reduce(buf)
        torch.cuda.synchronize()
        check("eager, after resume")
    else:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            buf.fill_(rank + 1)
            dist.all_reduce(buf)  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            dist.all_reduce(buf)
        buf.fill_(rank + 1)
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        check("graph, before pause")
        pause_resume()
        buf.fill_(rank + 1)
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        check("graph, after resume")
        del graph
    dist.barrier()
    dist.destroy_process_group()
    return 0


def run_setting(args, register, case):
    env = dict(os.environ, LD_PRELOAD=args.shim, PYTORCH_NO_CUDA_MEMORY_CACHING="1", NCCL_GRAPH_REGISTER=register,
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + int(register) * 2 + (case == "graph")),
               WORLD_SIZE="2", NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1",
               NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="REG")  # whether NCCL registered the buffer at all
    cmd = [sys.executable, os.path.abspath(__file__), "--shim", args.shim, "--module-dir", args.module_dir,
           "--mib", str(args.mib), "--case", case, "--rank-main"]
    procs = [subprocess.Popen(cmd, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    t0 = time.time()
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=max(1, args.timeout - (time.time() - t0)))[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            outs.append((p.communicate()[0] or "") + f"\nRESULT register={register} {case}: hang (> {args.timeout} s)")
    results = [ln for ln in outs[0].splitlines() if ln.startswith("RESULT ")]
    hung = any("hang" in r for o in outs for r in o.splitlines() if r.startswith("RESULT "))
    if hung:
        results = [ln for o in outs for ln in o.splitlines() if ln.startswith("RESULT ") and "hang" in ln][:1] + results
    if any(p.returncode not in (0, None) for p in procs) and not hung:
        tail = " | ".join(outs[0].strip().splitlines()[-3:])[:300]
        results.append(f"RESULT register={register} {case}: error (exit {[p.returncode for p in procs]}): {tail}")
    reg = [ln for ln in outs[0].splitlines() if " NCCL INFO " in ln and "reg" in ln.lower()]
    results.append(f"RESULT register={register} {case}: {len(reg)} NCCL INFO lines about registration on rank 0"
                   + (f", e.g. {reg[-1].split('NCCL INFO', 1)[1].strip()[:160]!r}" if reg else ""))
    for r in results:
        print(r, flush=True)
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shim", required=True)
    ap.add_argument("--module-dir", required=True)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=40)
    ap.add_argument("--case", choices=["eager", "graph"], default="eager")
    ap.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_main:
        return rank_main(args)
    import torch
    if torch.cuda.device_count() < 2:
        print("SKIP: fewer than two GPUs")
        return 77
    required_ok = True
    for register in ("1", "0"):
        for case in ("eager", "graph"):
            lines = run_setting(args, register, case)
            after = [ln for ln in lines if "after resume" in ln or "hang" in ln or ": error" in ln]
            good = bool(after) and all(ln.endswith(": correct") for ln in after)
            if (case == "eager" or register == "0") and not good:
                required_ok = False
    print("PASS" if required_ok else "FAIL")
    return 0 if required_ok else 1


if __name__ == "__main__":
    sys.exit(main())
