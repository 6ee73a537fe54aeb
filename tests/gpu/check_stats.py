#!/usr/bin/env python3
"""check_stats.py — checks cachalloc's JSON stats dump (CACHALLOC_CONF=stats:FILE).

Usage: check_stats.py DUMP.json [CONDITION ...]

A condition is `PATHS OP NUMBER` with OP one of > >= == <, and PATHS one or
more '/'-separated walks into the dump (stat names themselves contain dots)
joined by '+' (their values are summed), e.g.
    interposer/calls/cuMemAlloc_v2+interposer/calls/cudaMalloc>0
    devices/0/derived/device_allocations_avoided>0
    devices/0/stats/num_ooms>=1
Prints one summary line of the counters that show cachalloc served the
program, then each failed condition; exits 0 when all hold, 1 otherwise.
Also importable: load(), lookup(), summary(), check().
"""
import json
import re
import sys

ALLOC_ENTRIES = ("cuMemAlloc_v2", "cuMemAllocAsync", "cuMemAllocAsync_ptsz", "cudaMalloc", "cudaMallocAsync")
_COND = re.compile(r"^\s*([^<>=]+?)\s*(>=|==|>|<)\s*(-?[0-9.]+)\s*$")


def load(path):
    with open(path) as f:
        return json.load(f)


def lookup(dump, path):
    """The value at a '/'-separated path, or None when a step is missing."""
    node = dump
    for step in path.split("/"):
        if isinstance(node, list):
            if not step.isdigit() or int(step) >= len(node):
                return None
            node = node[int(step)]
        elif isinstance(node, dict) and step in node:
            node = node[step]
        else:
            return None
    return node


def _device0(dump):
    devices = dump.get("devices") or [{}]
    return devices[0]


def summary(dump):
    """The counters that say whether cachalloc served the allocations."""
    calls = lookup(dump, "interposer/calls") or {}
    passthrough = lookup(dump, "interposer/passthrough") or {}
    dev = _device0(dump)
    stats = dev.get("stats", {})
    derived = dev.get("derived", {})
    # Shared-cudart programs may be caught at cudaMalloc (the shim's runtime
    # exports) rather than at the driver entry points.
    return {
        "alloc_calls": sum(calls.get(k, 0) for k in ALLOC_ENTRIES),
        "cuMemAlloc_v2": calls.get("cuMemAlloc_v2", 0),
        "cudaMalloc": calls.get("cudaMalloc", 0),
        "cuMemAllocAsync": calls.get("cuMemAllocAsync", 0) + calls.get("cuMemAllocAsync_ptsz", 0),
        "cudaMallocAsync": calls.get("cudaMallocAsync", 0),
        "allocations": stats.get("allocation.all.allocated", 0),
        "device_allocs": stats.get("num_device_alloc", 0),
        "avoided": derived.get("device_allocations_avoided", 0),
        "ooms": stats.get("num_ooms", 0),
        "passthrough_capture": passthrough.get("capture", 0),
        "passthrough_foreign": passthrough.get("foreign_pointer", 0),
    }


def summary_line(dump):
    return "stats: " + " ".join(f"{k}={v}" for k, v in summary(dump).items())


def check(dump, conditions):
    """Returns the list of failure messages (empty when every condition holds)."""
    failures = []
    for cond in conditions:
        m = _COND.match(cond)
        if not m:
            failures.append(f"bad condition {cond!r}")
            continue
        path, op, want = m.group(1), m.group(2), float(m.group(3))
        values = [lookup(dump, p.strip()) for p in path.split("+")]
        missing = [p for p, v in zip(path.split("+"), values) if not isinstance(v, (int, float))]
        if missing:
            failures.append(f"{'+'.join(missing)}: missing from the dump (wanted {path} {op} {m.group(3)})")
            continue
        got = sum(values)
        holds = {">": got > want, ">=": got >= want, "==": got == want, "<": got < want}[op]
        if not holds:
            failures.append(f"{path} = {got}, wanted {op} {m.group(3)}")
    return failures


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    try:
        dump = load(argv[1])
    except (OSError, ValueError) as e:
        print(f"check_stats: cannot read the stats dump {argv[1]}: {e}")
        return 1
    print(summary_line(dump))
    failures = check(dump, argv[2:])
    for f in failures:
        print(f"check_stats: FAIL {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
