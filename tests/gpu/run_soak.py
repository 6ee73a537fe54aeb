#!/usr/bin/env python3
"""run_soak.py — the soak of issue 10: a PyTorch training loop for minutes
under libcachalloc.so, its losses bit-identical to a bare run of the same
steps, and device memory (NVML) flat after warm-up.

  run_soak.py --shim LIB.so --seconds S --out DIR [--rows ROWS.tsv]

Runs tests/gpu/clients/soak_torch.py under the shim for S seconds
(PYTORCH_NO_CUDA_MEMORY_CACHING=1, so every tensor reaches cachalloc), then
bare for the same number of steps with PyTorch's own caching allocator (what
a user runs without cachalloc; with caching off as well, the bare run takes
3x longer), and compares losses and memory.  Flat: after the first 20 % of
the steps, NVML's used memory moves by at most 64 MiB.  Prints one row
(`name<TAB>PASS|FAIL|SKIP<TAB>figure`); exit 0 pass, 1 fail, 77 skip.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SOAK = os.path.join(HERE, "clients", "soak_torch.py")
FLAT_BYTES = 64 << 20


def run(env_extra, args, log):
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", "CACHALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING")}
    env.update(env_extra)
    with open(log, "w") as f:
        return subprocess.run([sys.executable, SOAK] + args, env=env, stdout=f, stderr=subprocess.STDOUT).returncode


def drift(samples, steps):
    after = [b for s, b in samples if s >= steps // 5 and b >= 0]
    return (max(after) - min(after)) if after else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shim", required=True)
    ap.add_argument("--seconds", type=float, default=180)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    shim_json, bare_json = os.path.join(a.out, "soak-shim.json"), os.path.join(a.out, "soak-bare.json")
    stats = os.path.join(a.out, "soak-stats.json")
    rc = run({"LD_PRELOAD": a.shim, "CACHALLOC_CONF": f"stats:{stats}", "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, ["--seconds", str(a.seconds), "--out", shim_json],
             os.path.join(a.out, "soak-shim.log"))
    status, figure = "FAIL", ""
    if rc == 77:
        status, figure = "SKIP", "no torch or GPU"
    elif rc != 0:
        figure = f"run under the shim failed (exit {rc})"
    else:
        shim = json.load(open(shim_json))
        rc = run({}, ["--steps", str(shim["steps"]), "--out", bare_json], os.path.join(a.out, "soak-bare.log"))
        if rc != 0:
            figure = f"bare run failed (exit {rc})"
        else:
            bare = json.load(open(bare_json))
            same = shim["losses"] == bare["losses"]
            first_diff = next((i for i, (x, y) in enumerate(zip(shim["losses"], bare["losses"])) if x != y), None)
            d_shim, d_bare = drift(shim["nvml_used"], shim["steps"]), drift(bare["nvml_used"], bare["steps"])
            flat = d_shim is not None and d_shim <= FLAT_BYTES
            ok = same and flat
            status = "PASS" if ok else "FAIL"
            mib = lambda b: "n/a" if b is None else f"{b / 2**20:.0f} MiB"  # noqa: E731
            peak = max(b for _, b in shim["nvml_used"]) / 2**30
            bare_peak = max(b for _, b in bare["nvml_used"]) / 2**30
            figure = (f"{shim['steps']} steps in {shim['seconds']:.0f} s under the shim ({bare['seconds']:.0f} s bare); "
                      f"losses {'bit-identical' if same else f'differ from step {first_diff}'}; "
                      f"NVML used after warm-up moves {mib(d_shim)} (bare {mib(d_bare)}), peak {peak:.2f} GiB "
                      f"(bare, PyTorch's allocator: {bare_peak:.2f} GiB)")
    row = f"soak torch\t{status}\t{figure}"
    print(row)
    if a.rows:
        with open(a.rows, "a") as f:
            f.write(row + "\n")
    return {"PASS": 0, "SKIP": 77}.get(status, 1)


if __name__ == "__main__":
    sys.exit(main())
