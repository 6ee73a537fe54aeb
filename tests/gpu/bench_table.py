#!/usr/bin/env python3
"""bench_table.py — turns gpu_alloc_bench's BENCH lines into one comparison table.

Usage: bench_table.py BENCH_OUTPUT.txt [--rows ROWS.tsv]

Rows: each (cudart variant, path) bare and under the shim, next to the
reference figures measured on an H200 in /work/shared/notes/interposition-facts.md
(labelled as such: they are that note's numbers, not this run's).  --rows
writes one summary row per (variant, path) for scripts/gpu-check.sh.
"""
import argparse
import re
import sys

CASES = ["512B", "1MiB", "64MiB", "churn"]
LINE = re.compile(r"^BENCH variant=(\S+) shim=(\S+) path=(\S+) case=(\S+) ns=([0-9.]+)")

# From interposition-facts.md, "Latency baselines" (H200, median of one run).
REFERENCE = [
    ("notes: cudaMalloc+cudaFree, no shim", [61090, 61703, 85136, 15138]),
    ("notes: cudaMallocAsync, default pool", [723, 644, 614, 1167]),
    ("notes: PyTorch caching allocator", [445, 561, 478, 994]),
    ("notes: floor, static cudaMalloc", [80, 86, 83, None]),
    ("notes: floor, cudaMallocAsync", [40, 38, 36, None]),
    ("notes: floor, shared cudaMalloc", [107, 95, 102, None]),
]


def parse(path):
    figures = {}
    for line in open(path):
        m = LINE.match(line.strip())
        if m:
            variant, shim, bench_path, case, ns = m.groups()
            figures[(variant, bench_path, shim, case)] = float(ns)
    return figures


def fmt(x):
    return "-" if x is None else f"{x:,.0f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench_output")
    ap.add_argument("--rows")
    args = ap.parse_args()
    figures = parse(args.bench_output)
    if not figures:
        print("bench_table: no BENCH lines found")
        return 1
    keys = sorted({k[:3] for k in figures}, key=lambda k: (k[1], k[0], k[2]))
    header = f"{'path (cudart, shim)':<52} {'512 B':>9} {'1 MiB':>9} {'64 MiB':>9} {'churn/op':>9}"
    print("host ns per malloc+free pair (churn: ns per call), median of 7 runs")
    print(header)
    print("-" * len(header))
    for variant, bench_path, shim in keys:
        label = f"{bench_path} ({variant}, {'shim' if shim == 'yes' else 'bare'})"
        cells = [figures.get((variant, bench_path, shim, c)) for c in CASES]
        print(f"{label:<52} " + " ".join(f"{fmt(c):>9}" for c in cells))
    for label, cells in REFERENCE:
        print(f"{label:<52} " + " ".join(f"{fmt(c):>9}" for c in cells))
    if args.rows:
        with open(args.rows, "w") as out:
            for variant, bench_path in sorted({k[:2] for k in figures}):
                shim = figures.get((variant, bench_path, "yes", "1MiB"))
                bare = figures.get((variant, bench_path, "no", "1MiB"))
                churn = figures.get((variant, bench_path, "yes", "churn"))
                status = "PASS" if shim is not None and bare is not None else "FAIL"
                out.write(f"bench {variant} {bench_path}\t{status}\t"
                          f"1 MiB pair: shim {fmt(shim)} ns, bare {fmt(bare)} ns; churn shim {fmt(churn)} ns/op\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
