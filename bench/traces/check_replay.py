#!/usr/bin/env python3
"""check_replay.py — the meson tests `trace_replay` (suite unit) and
`trace_replay_recorded` (suite integration):

    check_replay.py TRACE_REPLAY_BINARY TRACES_DIR
    check_replay.py --record TRACE_REPLAY_BINARY DRIVER_PATTERNS LIBCACHALLOC FAKE_LIBCUDA_DIR

Replays the checked-in traces of bench/traces and compares every figure with
values worked out by hand (below), then checks the tool's plumbing: the
compact form (--extract) and gzip input give the same figures, a trace whose
ring dropped events is reported INCOMPLETE with the memory it could not see,
a trace without otherData is flagged, and the fake-driver recording
(driver_patterns.replay, the compact form of a trace of
examples/driver_patterns under the shim) replays to the recorded run's own
peaks, and replays through the per-thread front cache (--front) to the same
peaks with some requests served there.

--record checks the trace writer of today against the reader: it runs
examples/driver_patterns under the shim on the fake driver with `trace:`,
once with a large ring and once with a 64-entry ring, and replays both (every
allocation freed, nothing skipped; then the dropped events detected).
"""
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile

MiB = 1 << 20
failures = []


def check(what, got, want):
    if got != want:
        failures.append(f"{what}: got {got!r}, want {want!r}")


def replay(binary, traces, confs=None, extra=()):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        cmd = [binary, "--json", out, *extra]
        for c in confs or []:
            cmd += ["--conf", c]
        r = subprocess.run(cmd + traces, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            failures.append(f"{' '.join(cmd + traces)}: exit {r.returncode}: {r.stderr.strip()}")
        with open(out) as f:
            return json.load(f)["traces"], r.stdout


# --- synthetic.json: hand-computed figures ------------------------------------------
#
# The sequence (make_synthetic.py), block sizes as traced, streams A=0x2,
# B=0x5000, C=0x6000:
#   phase 1 on A: a1, a2, a3 = 6 MiB each; free a1, a3; a4 = 12 MiB; b1 = 1 KiB
#   on B, freed; a5 = 8 MiB; free a2, a4, a5;
#   empty_cache; a6 = 1.25 MiB + 512 B (live to the end)
#   phase 2 on C: c1, c2 = 8.5 MiB; free c1; c3 = 9 MiB; free c2, c3; c4 = 8.5 MiB
#
# classic, defaults: a1-a3 come from one 20 MiB segment (1-10 MiB requests),
#   split to [a1 a2 a3 | 2 MiB]; after the frees the free blocks are 6 MiB and
#   8 MiB, so a4 (12 MiB) gets its own 12 MiB segment (>= 10 MiB: rounded to
#   2 MiB); b1 a 2 MiB small segment on B: reserved 34 MiB, allocated 18 MiB
#   + 1 KiB.  a5 fits the 8 MiB block: allocated 6+12+8 = 26 MiB (the peak).
#   empty_cache returns all three; a6 takes a new 20 MiB segment.  On C: c1 and
#   c2 split a 20 MiB segment [c1 c2 | 3 MiB]; the 8.5 MiB hole and the 3 MiB
#   tail cannot hold c3 (9 MiB), so a second 20 MiB segment: 20+20+20 = 60 MiB
#   reserved (the peak), 3 segments at once.  c4 reuses a whole free segment.
#   6 device allocations.  reserved ÷ allocated 60/26; fragmentation 1-26/60.
# roundup_power2_divisions:4: 8.5 MiB rounds to 10 MiB (steps of 2 MiB in
#   [8, 16)), which gets a 10 MiB segment of its own (>= 10 MiB); c3 (9 -> 10
#   MiB) reuses c1's freed segment: 20 (a6) + 10 + 10 = 40 MiB, 6 device
#   allocations.  Phase 1 is unchanged (6, 12, 8 MiB and 1 KiB stay), so
#   allocated still peaks at 26 MiB.
# roundup_power2_divisions:8: 8.5 and 9 MiB both round to 9 MiB (1 MiB steps):
#   c1 c2 split one 20 MiB segment, c3 fits c1's hole: 40 MiB, 5 allocations.
# roundup_power2_divisions:[256:1,512:2,>:8]: one division below 256 MiB, so
#   nothing here rounds: as the defaults.
# max_split_size_mb:20: a request below 20 MiB never takes a free block of
#   20 MiB or more; c4 finds only two whole free 20 MiB segments, so a third:
#   80 MiB, 7 allocations, 4 segments at once.  (Phase 1 is unchanged: its
#   free blocks are all below 20 MiB.)
# max_split_size_mb:256: nothing is that large: as the defaults.
# cross_stream_reuse:false: as the defaults.  Cross-stream reuse (on by
#   default, core/steal_path.cpp) moves only whole free segments, and C
#   never meets one of another stream's: A's only segment holds a6.
# cross_stream_reuse:blocks: a request C's memory cannot serve may take a
#   block of a segment another stream still uses, lent: c1 and c2 are lent
#   from A's 20 MiB segment (a6 holds 1.25 MiB + 512 B of it), leaving
#   1.75 MiB - 512 B.  A lent block's free waits for an event on C, which
#   the replay never completes: c1 stays active.  c3 finds nothing and maps
#   C's own 20 MiB segment: 20 + 20 = 40 MiB, 5 device allocations; c4
#   splits c3's freed segment.  Active peaks at a6 + c1 (waiting) + c2 + c3
#   = 27.25 MiB + 512 B: fragmentation 1 - that / 40 MiB.
# expandable_segments:true (pages of 20 MiB in the large pool, 2 MiB in the
#   small): A maps 20 MiB for a1-a3; a4 needs 12 MiB with 8 MiB free at the
#   end, so 20 MiB more are mapped (40); b1 maps 2 MiB on B: 42 MiB.  a5 splits
#   the 16 MiB free end.  empty_cache unmaps every free page and releases the
#   empty reservations; a6 maps 20 MiB again; on C, c1 c2 take one 20 MiB
#   page, c3 maps a second one after the 3 MiB free tail: 20 + 40 = 60 MiB.
#   Device allocations = pages: 1+1+1 + 1 + 2 = 6; segments are reservations,
#   at most 2 at once (A and B; then A and C).
EXPECT = {  # conf: (peak reserved, peak allocated, device allocs, peak segments)
    "": (60 * MiB, 26 * MiB, 6, 3),
    "cross_stream_reuse:false": (60 * MiB, 26 * MiB, 6, 3),
    "cross_stream_reuse:blocks": (40 * MiB, 26 * MiB, 5, 3),
    "roundup_power2_divisions:4": (40 * MiB, 26 * MiB, 6, 3),
    "roundup_power2_divisions:8": (40 * MiB, 26 * MiB, 5, 3),
    "roundup_power2_divisions:[256:1,512:2,>:8]": (60 * MiB, 26 * MiB, 6, 3),
    "max_split_size_mb:20": (80 * MiB, 26 * MiB, 7, 4),
    "max_split_size_mb:256": (60 * MiB, 26 * MiB, 6, 3),
    "expandable_segments:true": (60 * MiB, 26 * MiB, 6, 2),
    "expandable_segments:true,roundup_power2_divisions:[256:1,512:2,>:8]": (60 * MiB, 26 * MiB, 6, 2),
}
# Peak active where it is not peak allocated (a block waits for an event).
ACTIVE = {"cross_stream_reuse:blocks": 27 * MiB + 256 * 1024 + 512}


def check_synthetic(binary, d):
    path = os.path.join(d, "synthetic.json")
    traces, md = replay(binary, [path], list(EXPECT))
    check("synthetic: entries", len(traces), 1)
    if not traces:
        return None
    t = traces[0]
    for key, want in [("events", 30), ("allocs", 11), ("frees", 9), ("empty_caches", 1), ("skipped_frees", 0),
                      ("live_reallocs", 0), ("requested_sizes", 0), ("dropped_events", 0), ("other_data", True),
                      ("trace_peak_live", 26 * MiB), ("live_at_end", 1311232 + 8 * MiB + 512 * 1024),
                      ("streams", [0x2, 0x5000, 0x6000]), ("device", 0), ("pid", 4242)]:
        check(f"synthetic: {key}", t[key], want)
    rec = t["recorded"]
    for key, want in [("start_allocated", 0), ("start_reserved", 0), ("peak_allocated", 26 * MiB),
                      ("peak_reserved", 60 * MiB), ("segment_maps", 6), ("segment_unmaps", 3), ("ooms", 0)]:
        check(f"synthetic: recorded {key}", rec[key], want)
    by_conf = {s["conf"]: s for s in t["settings"]}
    check("synthetic: settings", sorted(by_conf), sorted(EXPECT))
    for conf, (res, alloc, dev_allocs, segs) in EXPECT.items():
        s = by_conf.get(conf)
        if s is None:
            continue
        name = conf or "defaults"
        check(f"synthetic [{name}] peak_reserved", s["peak_reserved"], res)
        check(f"synthetic [{name}] peak_allocated", s["peak_allocated"], alloc)
        active = ACTIVE.get(conf, alloc)  # else nothing waits on an event
        check(f"synthetic [{name}] peak_active", s["peak_active"], active)
        check(f"synthetic [{name}] num_device_alloc", s["num_device_alloc"], dev_allocs)
        check(f"synthetic [{name}] peak_segments", s["peak_segments"], segs)
        check(f"synthetic [{name}] retries", s["num_alloc_retries"], 0)
        check(f"synthetic [{name}] ooms", s["num_ooms"], 0)
        check(f"synthetic [{name}] error", s["error"], "")
        check(f"synthetic [{name}] reserved ÷ allocated", round(s["reserved_over_allocated"], 6), round(res / alloc, 6))
        check(f"synthetic [{name}] fragmentation", round(s["fragmentation"], 6), round(1 - active / res, 6))
        check(f"synthetic [{name}] reserved ÷ trace peak", round(s["reserved_over_trace_peak"], 6),
              round(res / (26 * MiB), 6))
    for text in ["### synthetic, device 0",
                 "| classic (defaults) | 60.00 MiB | 26.00 MiB | 2.308 | 0.567 | 2.308 | 6 | 3 | 0 | 0 |",
                 "| max_split_size_mb:20 | 80.00 MiB | 26.00 MiB | 3.077 | 0.675 | 3.077 | 7 | 4 | 0 | 0 |",
                 "| cross_stream_reuse:blocks | 40.00 MiB | 26.00 MiB | 1.538 | 0.319 | 1.538 | 5 | 3 | 0 | 0 |",
                 "| recorded run (from the trace) | 60.00 MiB | 26.00 MiB | 2.308 | n/a | 2.308 | 6 maps |"]:
        if text not in md:
            failures.append(f"synthetic: markdown lacks {text!r}")
    # the default list runs too; max_split_size_mb:64 changes nothing here
    dtraces, _ = replay(binary, [path])
    if dtraces:
        confs = [s["conf"] for s in dtraces[0]["settings"]]
        check("default settings", len(confs), 8)
        m64 = next((s for s in dtraces[0]["settings"] if s["conf"] == "max_split_size_mb:64"), None)
        check("default settings: max_split_size_mb:64 reserved", m64 and m64["peak_reserved"], 60 * MiB)
    return t


def figures(entry):
    """What must not depend on the input's form."""
    keep = {k: v for k, v in entry.items() if k not in ("file", "name", "settings")}
    keep["settings"] = [{k: v for k, v in s.items() if k != "seconds"} for s in entry["settings"]]
    return keep


def check_forms(binary, d, tmp, base):
    path = os.path.join(d, "synthetic.json")
    confs = ["", "expandable_segments:true"]
    want, _ = replay(binary, [path], confs)
    forms = []
    plain = os.path.join(tmp, "s.replay")
    subprocess.run([binary, "--extract", plain, path], check=False)
    forms.append(plain)
    if shutil.which("gzip"):
        packed = os.path.join(tmp, "s.replay.gz")
        subprocess.run([binary, "--extract", packed, path], check=False)
        forms.append(packed)
        gz_json = os.path.join(tmp, "s.json.gz")
        with open(path, "rb") as src, gzip.open(gz_json, "wb") as dst:
            dst.write(src.read())
        forms.append(gz_json)
    for form in forms:
        got, _ = replay(binary, [form], confs)
        if not got or not want:
            failures.append(f"{form}: no figures")
            continue
        g, w = figures(got[0]), figures(want[0])
        for k in sorted(set(g) | set(w)):
            check(f"{os.path.basename(form)}: {k}", g.get(k), w.get(k))


def check_dropped(binary, d, tmp):
    """The ring kept all but the first two events (segment_map and a1)."""
    with open(os.path.join(d, "synthetic.json")) as f:
        doc = json.load(f)
    ev = doc["traceEvents"]
    meta = [e for e in ev if e["ph"] == "M"]
    rest = [e for e in ev if e["ph"] != "M"]
    doc["traceEvents"] = meta + rest[6:]  # two instants, each with its two counters
    doc["otherData"]["dropped_events"] = 2
    doc["otherData"]["trace_max_entries"] = 28
    doc["otherData"]["recorded_events"] = 28
    dropped = os.path.join(tmp, "dropped.json")
    with open(dropped, "w") as f:
        json.dump(doc, f)
    traces, md = replay(binary, [dropped], [""])
    if traces:
        t = traces[0]
        check("dropped: dropped_events", t["dropped_events"], 2)
        check("dropped: start_allocated", t["recorded"]["start_allocated"], 6 * MiB)  # a1 was live
        check("dropped: start_reserved", t["recorded"]["start_reserved"], 20 * MiB)
        check("dropped: skipped_frees", t["skipped_frees"], 1)  # a1's free
        check("dropped: recorded peak_reserved", t["recorded"]["peak_reserved"], 60 * MiB)
    if "INCOMPLETE: the ring (trace_max_entries 28) dropped the 2 oldest events" not in md \
            or "6.00 MiB allocated and 20.00 MiB reserved" not in md \
            or "1 frees of addresses never allocated in the trace were skipped" not in md:
        failures.append("dropped: no INCOMPLETE note: " + md[:600])
    del doc["otherData"]
    no_other = os.path.join(tmp, "no-other.json")
    with open(no_other, "w") as f:
        json.dump(doc, f)
    traces, md = replay(binary, [no_other], [""])
    if traces:
        check("no otherData: other_data", traces[0]["other_data"], False)
    if "no otherData" not in md:
        failures.append("no otherData: not flagged")


def check_requested(binary, d):
    """args.requested (not written today) is preferred to the block size."""
    confs = ["", "roundup_power2_divisions:4", "roundup_power2_divisions:8"]
    traces, _ = replay(binary, [os.path.join(d, "synthetic-requested.json")], confs)
    if not traces:
        return
    t = traces[0]
    check("requested: requested_sizes", t["requested_sizes"], 1)
    check("requested: trace_peak_live", t["trace_peak_live"], 7 * MiB + 100)
    check("requested: recorded peak_allocated", t["recorded"]["peak_allocated"], 8 * MiB)
    got = {s["conf"]: (s["peak_allocated"], s["peak_requested"], s["peak_reserved"]) for s in t["settings"]}
    # 7 MiB + 100 B: 512 B rounding -> 7 MiB + 512; 4 divisions of [4, 8) MiB -> 8 MiB; 8 -> 7.5 MiB
    check("requested: defaults", got.get(""), (7 * MiB + 512, 7 * MiB + 100, 20 * MiB))
    check("requested: rp2 4", got.get("roundup_power2_divisions:4"), (8 * MiB, 7 * MiB + 100, 20 * MiB))
    check("requested: rp2 8", got.get("roundup_power2_divisions:8"), (7 * MiB + 512 * 1024, 7 * MiB + 100, 20 * MiB))


def check_recorded(binary, d):
    """A trace recorded by the shim on the fake driver: the classic replay must
    give the recorded run's own peaks (its program frees every block on the
    stream it was allocated on, or synchronizes first).  The recording
    predates cross-stream reuse, which moves whole segments between its
    streams (86 MiB instead of 90), so the replay leaves it out too."""
    path = os.path.join(d, "driver_patterns.replay")
    if not os.path.exists(path):
        failures.append(f"{path} missing")
        return
    traces, _ = replay(binary, [path], ["cross_stream_reuse:false"])
    for t in traces:
        s = t["settings"][0]
        check(f"driver_patterns device {t['device']}: dropped", t["dropped_events"], 0)
        check(f"driver_patterns device {t['device']}: skipped frees", t["skipped_frees"], 0)
        check(f"driver_patterns device {t['device']}: peak_allocated", s["peak_allocated"], t["recorded"]["peak_allocated"])
        check(f"driver_patterns device {t['device']}: peak_reserved", s["peak_reserved"], t["recorded"]["peak_reserved"])
        check(f"driver_patterns device {t['device']}: error", s["error"], "")
    if not traces:
        failures.append("driver_patterns: no device replayed")


def check_front(binary, d):
    """--front: the same trace through the per-thread front cache first (the
    shim's route); the caches serve some requests, and on this trace they
    change no peak (they keep small blocks only, given back before the cache
    grows)."""
    path = os.path.join(d, "driver_patterns.replay")
    core, _ = replay(binary, [path], [""])
    front, _ = replay(binary, [path], [""], ["--front"])
    if not core or not front:
        return
    c, f = core[0]["settings"][0], front[0]["settings"][0]
    check("front: error", f["error"], "")
    check("front: core-only replay has no front hits", c["front_hits"], 0)
    if f["front_hits"] <= 0:
        failures.append(f"front: no request served by the thread cache ({f['front_hits']})")
    for key in ("peak_reserved", "peak_allocated", "num_device_alloc"):
        check(f"front: {key} as the core alone", f[key], c[key])


def check_live(binary, program, shim, fake_dir):
    with tempfile.TemporaryDirectory() as tmp:
        for ring in (1 << 20, 64):
            env = dict(os.environ, LD_PRELOAD=shim, LD_LIBRARY_PATH=fake_dir, FAKE_CUDA_TOTAL_MB="1024",
                       CACHALLOC_CONF=f"trace:{tmp}/live-{ring}.json,trace_max_entries:{ring}")
            r = subprocess.run([program], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if r.returncode != 0:
                failures.append(f"driver_patterns under the shim: exit {r.returncode}: {r.stdout[-500:]}")
                continue
            path = f"{tmp}/live-{ring}.json"
            if not os.path.exists(path):
                failures.append(f"no trace written at {path}")
                continue
            traces, md = replay(binary, [path], ["", "expandable_segments:true"])
            check(f"ring {ring}: devices", len(traces), 1)
            for t in traces:
                check(f"ring {ring}: other_data", t["other_data"], True)
                for s in t["settings"]:
                    check(f"ring {ring} [{s['conf']}]: error", s["error"], "")
                if ring > 64:
                    check(f"ring {ring}: dropped", t["dropped_events"], 0)
                    check(f"ring {ring}: skipped frees", t["skipped_frees"], 0)
                    check(f"ring {ring}: allocs == frees", t["allocs"], t["frees"])
                    check(f"ring {ring}: live at end", t["live_at_end"], 0)
                    if t["allocs"] < 100:
                        failures.append(f"ring {ring}: only {t['allocs']} allocations traced")
                    check(f"ring {ring}: classic replay peak_allocated", t["settings"][0]["peak_allocated"],
                          t["recorded"]["peak_allocated"])
                else:
                    check(f"ring {ring}: events kept", t["events"], 64)
                    if t["dropped_events"] <= 0 or "INCOMPLETE" not in md:
                        failures.append(f"ring {ring}: dropped events not detected")


def main():
    if len(sys.argv) == 6 and sys.argv[1] == "--record":
        check_live(*sys.argv[2:])
        for f in failures:
            print("FAIL", f)
        print(f"check_replay --record: {'FAIL' if failures else 'PASS'} ({len(failures)} failures)")
        return 1 if failures else 0
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    binary, d = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        check_synthetic(binary, d)
        check_forms(binary, d, tmp, None)
        check_dropped(binary, d, tmp)
        check_requested(binary, d)
        check_recorded(binary, d)
        check_front(binary, d)
    for f in failures:
        print("FAIL", f)
    print(f"check_replay: {'FAIL' if failures else 'PASS'} ({len(failures)} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
