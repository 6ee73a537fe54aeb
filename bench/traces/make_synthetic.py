#!/usr/bin/env python3
"""make_synthetic.py — writes bench/traces/synthetic.json and
bench/traces/synthetic-requested.json, tiny traces in exactly the layout
cachalloc's `trace:` writer produces (core/obs/trace_json.cpp: one line,
metadata, then per event an instant event and two counters, otherData last).

synthetic.json is what cachalloc with its defaults (classic segments) would
record for the sequence below; the segment_map/segment_unmap events and the
counters are those of that run, worked out by hand (check_replay.py has the
derivation of every figure).  synthetic-requested.json is a three-event trace
whose alloc events also carry `args.requested`, which the current writer does
not emit: it checks that the replay prefers it when present.

    python3 bench/traces/make_synthetic.py   # rewrites both files
"""
import json
import os

MiB = 1 << 20
A = 0x2        # the shim's stream of plain cuMemAlloc/cudaMalloc blocks
B = 0x5000     # a side stream (cuMemAllocAsync on a created stream)
C = 0x6000     # another one, for the second phase
PID = 4242

# (kind, ptr, size, stream[, requested]); ptrs as the recorded run had them.
SEG1, SEG2, SEG3, SEG4 = 0x7F0000000000, 0x7F0001410000, 0x7F0002020000, 0x7F0002230000
SEG5, SEG6 = 0x7F0003640000, 0x7F0004A50000
EVENTS = [
    ("segment_map", SEG1, 20 * MiB, A),          # 20 MiB segment for a 1-10 MiB request
    ("alloc", SEG1, 6 * MiB, A),                 # a1
    ("alloc", SEG1 + 6 * MiB, 6 * MiB, A),       # a2
    ("alloc", SEG1 + 12 * MiB, 6 * MiB, A),      # a3 (2 MiB left: split)
    ("free", SEG1, 6 * MiB, A),                  # a1
    ("free", SEG1 + 12 * MiB, 6 * MiB, A),       # a3, merges with the 2 MiB tail
    ("segment_map", SEG2, 12 * MiB, A),          # no free block of 12 MiB
    ("alloc", SEG2, 12 * MiB, A),                # a4
    ("segment_map", SEG3, 2 * MiB, B),           # small pool, stream B
    ("alloc", SEG3, 1024, B),                    # b1
    ("free", SEG3, 1024, B),                     # b1
    ("alloc", SEG1 + 12 * MiB, 8 * MiB, A),      # a5 takes the 8 MiB free block exactly
    ("free", SEG1 + 6 * MiB, 6 * MiB, A),        # a2
    ("free", SEG2, 12 * MiB, A),                 # a4
    ("free", SEG1 + 12 * MiB, 8 * MiB, A),       # a5
    ("segment_unmap", SEG1, 20 * MiB, A),        # empty_cache: its unmaps come first
    ("segment_unmap", SEG2, 12 * MiB, A),
    ("segment_unmap", SEG3, 2 * MiB, B),
    ("empty_cache", 0, 0, 0),
    ("segment_map", SEG4, 20 * MiB, A),
    ("alloc", SEG4, 1311232, A),                 # a6 (1.25 MiB + 512 B), live at the end
    # second phase, on stream C: a hole that only rounding makes reusable,
    # then a whole free 20 MiB segment that max_split_size_mb:20 refuses to split
    ("segment_map", SEG5, 20 * MiB, C),
    ("alloc", SEG5, 8 * MiB + 512 * 1024, C),                 # c1 8.5 MiB
    ("alloc", SEG5 + 8 * MiB + 512 * 1024, 8 * MiB + 512 * 1024, C),  # c2 8.5 MiB (3 MiB left)
    ("free", SEG5, 8 * MiB + 512 * 1024, C),                  # c1: an 8.5 MiB hole
    ("segment_map", SEG6, 20 * MiB, C),                       # 9 MiB fits neither hole nor tail
    ("alloc", SEG6, 9 * MiB, C),                              # c3
    ("free", SEG5 + 8 * MiB + 512 * 1024, 8 * MiB + 512 * 1024, C),  # c2: SEG5 whole and free
    ("free", SEG6, 9 * MiB, C),                               # c3: SEG6 whole and free
    ("alloc", SEG5, 8 * MiB + 512 * 1024, C),                 # c4, live at the end
]

REQUESTED = [  # block sizes as recorded, and the sizes the program asked for
    ("segment_map", SEG1, 20 * MiB, A),
    ("alloc", SEG1, 8 * MiB, A, 7 * MiB + 100),  # a 7 MiB request that got a whole unsplit block
    ("free", SEG1, 8 * MiB, A),
]


def trace(events):
    out = [{"name": "process_name", "ph": "M", "pid": PID, "args": {"name": f"cachalloc {PID}"}},
           {"name": "thread_name", "ph": "M", "pid": PID, "tid": 0, "args": {"name": "device 0"}}]
    allocated = reserved = 0
    for i, ev in enumerate(events):
        kind, ptr, size, stream = ev[:4]
        allocated += {"alloc": size, "free": -size}.get(kind, 0)
        reserved += {"segment_map": size, "segment_unmap": -size}.get(kind, 0)
        ts = f"{i * 1.5:.3f}"
        args = {"device": 0, "ptr": hex(ptr), "size": size, "stream": hex(stream)}
        if len(ev) > 4:
            args["requested"] = ev[4]
        out.append({"name": kind, "cat": "cachalloc", "ph": "i", "s": "p", "ts": ts, "pid": PID, "tid": 0,
                    "args": args})
        for what, value in (("allocated", allocated), ("reserved", reserved)):
            out.append({"name": f"{what} bytes (device 0)", "ph": "C", "ts": ts, "pid": PID,
                        "args": {"bytes": value}})
    doc = {"traceEvents": out, "displayTimeUnit": "ns",
           "otherData": {"version": 1, "dropped_events": 0, "trace_max_entries": 1048576,
                         "recorded_events": len(events)}}
    # ts are numbers with three decimals in the writer's output
    text = json.dumps(doc, separators=(",", ":"))
    for i in range(len(events)):
        text = text.replace(f'"ts":"{i * 1.5:.3f}"', f'"ts":{i * 1.5:.3f}')
    return text + "\n"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    for name, events in (("synthetic.json", EVENTS), ("synthetic-requested.json", REQUESTED)):
        with open(os.path.join(here, name), "w") as f:
            f.write(trace(events))


if __name__ == "__main__":
    main()
