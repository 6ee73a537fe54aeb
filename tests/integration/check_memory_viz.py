#!/usr/bin/env python3
"""check_memory_viz.py — is a `cachalloc-report viz` pickle what PyTorch's
memory_viz expects, and does it say what cachalloc recorded?

    check_memory_viz.py PICKLE SNAPSHOT.json [TRACE.json] [--expect WHAT ...]
                        [--torch auto|require|skip] [--html-dir DIR]

Checks, in order (the first failure is printed and the exit status is 1;
when all ran and passed it is 0, or 77 when the PyTorch part could not run
under --torch auto: "skipped", as meson and automake count 77):
  1. the pickle uses only the opcodes and protocols (2..4) that the unpickler
     in torch/utils/viz/MemoryViz.js (pytorch.org/memory_viz) implements;
  2. the structure of torch.cuda.memory._snapshot() (keys and types of the
     snapshot, segments, blocks, trace entries, allocator_settings; one
     device_traces list per device; blocks tiling their segment, which
     MemoryViz.js relies on to compute block addresses and _memory_viz.segsum
     asserts);
  3. faithfulness: per device, the active blocks, the reserved (mapped) bytes
     and the trace events are those of SNAPSHOT.json and TRACE.json;
  4. MemoryViz.js, emulated: annotate_snapshot, process_alloc_data (the
     "Active Memory Timeline" and "Active Cached Segment Timeline" views) and
     the "Allocator State History" view walking back from the snapshot for
     every selectable event (where the page would throw a TypeError);
  5. with PyTorch importable (--torch auto, the default; require fails
     without it): torch.cuda._memory_viz's trace_plot, segment_plot, segsum,
     trace, segments and memory on the data, and the `python -m
     torch.cuda._memory_viz trace_plot|segment_plot` command lines (HTML into
     --html-dir when given).
--expect names what must be in it: pending (a block active_pending_free and
its lone free_requested), expandable, oom, devices=N.
Standard library only.  Prints one "ok ..." line per group of checks.
"""
import argparse
import base64
import bisect
import json
import os
import pickle
import pickletools
import re
import subprocess
import sys
import tempfile

# The opcodes unpickle() in MemoryViz.js handles (PyTorch main, 2026).
JS_OPCODES = {"PROTO", "APPEND", "APPENDS", "LIST", "TUPLE", "NEWFALSE", "NEWTRUE", "NONE", "BINGET",
              "BININT", "BININT1", "BININT2", "EMPTY_DICT", "EMPTY_LIST", "FRAME", "LONG1", "LONG_BINGET",
              "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "SETITEMS", "SETITEM", "DICT",
              "SHORT_BINUNICODE", "BINUNICODE", "STOP", "EMPTY_TUPLE", "TUPLE1", "TUPLE2", "TUPLE3",
              "BINFLOAT"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "snapshot", "oom"}
STATES = {"active_allocated", "active_pending_free", "inactive"}
SETTINGS_KEYS = {"PYTORCH_CUDA_ALLOC_CONF", "max_split_size", "garbage_collection_threshold",
                 "expandable_segments", "pinned_num_register_threads", "release_lock_on_cudamalloc",
                 "pinned_use_cuda_host_register", "roundup_power2_divisions"}


class Failed(Exception):
    pass


def need(cond, msg):
    if not cond:
        raise Failed(msg)


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


# --- 1. pickle opcodes ---------------------------------------------------------

def check_opcodes(raw):
    protos = set()
    for op, arg, _ in pickletools.genops(raw):
        need(op.name in JS_OPCODES, f"opcode {op.name} is not one MemoryViz.js can read")
        if op.name == "PROTO":
            protos.add(arg)
        if op.name == "LONG1":  # JS numbers: exact below 2**53
            need(abs(arg) < 2 ** 53, f"integer {arg} loses precision in MemoryViz.js")
    need(protos and all(2 <= p <= 4 for p in protos), f"pickle protocol {protos}: MemoryViz.js reads 2..4")
    print(f"ok opcodes: protocol {sorted(protos)}, only opcodes MemoryViz.js implements")


# --- 2. structure --------------------------------------------------------------

def check_structure(data):
    need(isinstance(data, dict), "not a dict")
    for key in ("segments", "device_traces", "allocator_settings", "external_annotations"):
        need(key in data, f"no {key!r}")
    need(isinstance(data["segments"], list) and isinstance(data["device_traces"], list), "segments/device_traces not lists")
    need(all(isinstance(t, list) for t in data["device_traces"]), "device_traces entries not lists")
    need(isinstance(data["external_annotations"], list), "external_annotations not a list")
    settings = data["allocator_settings"]
    need(isinstance(settings, dict) and SETTINGS_KEYS <= set(settings),
         f"allocator_settings lacks {SETTINGS_KEYS - set(settings)}")
    need(isinstance(settings["roundup_power2_divisions"], dict), "roundup_power2_divisions not a dict")
    ndev = len(data["device_traces"])
    last = (-1, -1)
    for seg in data["segments"]:
        for key, typ in (("device", int), ("address", int), ("total_size", int), ("allocated_size", int),
                         ("active_size", int), ("requested_size", int), ("stream", int),
                         ("segment_type", str), ("segment_pool_id", tuple), ("is_expandable", bool),
                         ("frames", list), ("blocks", list)):
            need(key in seg and isinstance(seg[key], typ), f"segment {seg.get('address')}: {key!r} missing or not {typ.__name__}")
        need(0 <= seg["device"] < ndev, f"segment device {seg['device']} but {ndev} device_traces lists")
        need(seg["segment_type"] in ("small", "large"), f"segment_type {seg['segment_type']}")
        need(len(seg["segment_pool_id"]) == 2 and all(is_int(x) for x in seg["segment_pool_id"]), "segment_pool_id")
        key = (seg["device"], seg["address"])
        need(key > last, f"segments not sorted by device and address at {key}")
        if last[0] == seg["device"]:
            need(prev_end <= seg["address"], f"device {seg['device']}: segments overlap at {seg['address']:#x}")
        last, prev_end = key, seg["address"] + seg["total_size"]
        need(seg["blocks"], f"segment {seg['address']:#x} has no blocks")
        addr = seg["address"]
        allocated = active = requested = 0
        for b in seg["blocks"]:
            for k, typ in (("address", int), ("size", int), ("requested_size", int), ("state", str), ("frames", list)):
                need(k in b and isinstance(b[k], typ), f"block {b.get('address')}: {k!r} missing or not {typ.__name__}")
            need(b["address"] == addr, f"block {b['address']:#x} does not follow at {addr:#x} (MemoryViz computes addresses)")
            need(b["state"] in STATES, f"block state {b['state']}")
            need(b["size"] > 0 and 0 <= b["requested_size"] <= b["size"], f"block {addr:#x} sizes")
            if b["state"] == "inactive":
                need(b["requested_size"] == 0, f"inactive block {addr:#x} with a requested size")
            if b["state"] == "active_allocated":
                allocated += b["size"]
            if b["state"] != "inactive":
                active += b["size"]
                requested += b["requested_size"]
            addr += b["size"]
        need(addr == seg["address"] + seg["total_size"], f"segment {seg['address']:#x}: blocks do not sum to total_size")
        need((seg["allocated_size"], seg["active_size"], seg["requested_size"]) == (allocated, active, requested),
             f"segment {seg['address']:#x}: allocated/active/requested sizes disagree with its blocks")
    entries = 0
    for device, trace in enumerate(data["device_traces"]):
        t_last = None
        for e in trace:
            need(isinstance(e, dict) and e.get("action") in ACTIONS, f"device {device}: action {e.get('action')}")
            addr_key = "device_free" if e["action"] == "oom" else "addr"
            for k in (addr_key, "size", "stream", "time_us"):
                need(is_int(e.get(k)), f"device {device}: {e['action']} entry: {k!r} missing or not an int")
            need(isinstance(e.get("frames"), list), f"device {device}: entry without a frames list")
            need(t_last is None or e["time_us"] >= t_last, f"device {device}: time_us goes back")
            t_last = e["time_us"]
            entries += 1
    print(f"ok structure: {len(data['segments'])} segments, {ndev} device_traces lists, {entries} trace entries")


# --- 3. faithfulness -----------------------------------------------------------

def check_faithful(data, snap, trace):
    ndev = len(data["device_traces"])
    wanted = {int(d["device"]) for d in snap["devices"]}
    for dev in wanted:
        mine = [s for s in data["segments"] if s["device"] == dev]
        theirs = [s for d in snap["devices"] if int(d["device"]) == dev for s in d["segments"]]
        mapped = sum(b["size"] for s in theirs for b in s["blocks"] if b["state"] != "unmapped")
        need(sum(s["total_size"] for s in mine) == mapped, f"device {dev}: reserved bytes differ from the snapshot")
        def blocks_of(segs, state):
            return sorted((b["address"], b["size"], b["requested_size"]) for s in segs for b in s["blocks"]
                          if b["state"] == state)
        need(blocks_of(theirs, "active_allocated") == blocks_of(mine, "active_allocated"),
             f"device {dev}: allocated blocks differ from the snapshot")
        pending, got = blocks_of(theirs, "active_pending_free"), blocks_of(mine, "active_pending_free")
        if trace is None:
            need(pending == got, f"device {dev}: pending blocks differ from the snapshot")
        else:  # pending blocks the trace does not show freed by the program become inactive
            inactive = {(b["address"], b["size"]) for s in mine for b in s["blocks"] if b["state"] == "inactive"}
            need(set(got) <= set(pending) and all((a, n) in inactive for a, n, _ in set(pending) - set(got)),
                 f"device {dev}: pending blocks neither kept nor written as inactive")
            last = {}
            for e in trace["traceEvents"]:
                if e.get("ph") == "i" and e["name"] in ("alloc", "free") and int(e["args"]["device"]) == dev:
                    last[int(e["args"]["ptr"], 16)] = (e["name"], e["args"]["size"])
            dropped = bool(trace.get("otherData", {}).get("dropped_events"))
            for a, n, _ in pending:
                kept = any((x, y) == (a, n) for x, y, _ in got)
                if a not in last and dropped:
                    continue  # its free may be among the dropped events: either is right
                need(kept == (last.get(a) == ("free", n)),
                     f"device {dev}: pending block {a:#x} {'kept' if kept else 'written as inactive'}, "
                     "against the trace's last event there")
    need(ndev == max(list(wanted) + [0]) + 1 or trace is not None, f"{ndev} device_traces lists for devices {wanted}")
    if trace is None:
        need(all(not t for t in data["device_traces"]), "trace entries without a trace")
        print("ok faithful: segments and blocks per device as in the snapshot (no trace)")
        return
    instants = [e for e in trace["traceEvents"] if e.get("ph") == "i"]
    devices = wanted | {int(e["args"]["device"]) for e in instants}
    need(ndev == max(devices) + 1, f"{ndev} device_traces lists for devices {sorted(devices)}")
    for dev in range(ndev):
        ours = data["device_traces"][dev]
        theirs = [e for e in instants if int(e["args"]["device"]) == dev]
        kinds = {}
        for e in theirs:
            kinds[e["name"]] = kinds.get(e["name"], 0) + 1
        count = lambda *acts: sum(1 for e in ours if e["action"] in acts)
        need(count("alloc") == kinds.get("alloc", 0), f"device {dev}: alloc entries")
        need(count("free_requested") == kinds.get("free", 0), f"device {dev}: free_requested entries")
        need(count("free_completed") <= kinds.get("free", 0), f"device {dev}: free_completed entries")
        need(count("segment_alloc", "segment_map") == kinds.get("segment_map", 0), f"device {dev}: segment_alloc/map entries")
        need(count("segment_free", "segment_unmap") == kinds.get("segment_unmap", 0), f"device {dev}: segment_free/unmap entries")
        need(count("oom") == kinds.get("oom", 0), f"device {dev}: oom entries")
        # same blocks and segments, same order
        seq = [(e["name"], int(e["args"]["ptr"], 16), e["args"]["size"]) for e in theirs
               if e["name"] in ("alloc", "free", "segment_map", "segment_unmap")]
        mine = [({"free_requested": "free", "segment_alloc": "segment_map", "segment_free": "segment_unmap"}
                 .get(e["action"], e["action"]), e["addr"], e["size"]) for e in ours
                if e["action"] not in ("free_completed", "oom", "snapshot")]
        need(seq == mine, f"device {dev}: trace entries are not the trace's events in order")
    print(f"ok faithful: per device, blocks and reserved bytes as in the snapshot, trace events as in the trace")


# --- 4. MemoryViz.js, emulated -------------------------------------------------

def annotate(data):
    """annotate_snapshot(): collapses adjacent free_requested/free_completed into
    "free", computes block addresses from the segment address (as the page
    does), returns the per-device event lists."""
    traces = []
    for dev_trace in data["device_traces"]:
        new = []
        for t in dev_trace:
            t = dict(t)
            if t["action"] == "free_completed" and new and new[-1]["action"] == "free_requested" \
                    and new[-1]["addr"] == t["addr"]:
                new[-1]["action"] = "free"
                continue
            new.append(t)
        traces.append(new)
    for seg in data["segments"]:
        addr = seg["address"]
        for b in seg["blocks"]:
            b["addr"] = addr
            addr += b["size"]
    return traces


def process_alloc_data(data, traces, device, plot_segments):
    """process_alloc_data(): the live set at the end of the timeline."""
    alloc = "segment_alloc" if plot_segments else "alloc"
    frees = ("segment_free",) if plot_segments else ("free", "free_completed")
    addr_to_alloc, initially = {}, []
    for e in traces[device]:
        if e["action"] == alloc:
            addr_to_alloc[e["addr"]] = e
        elif e["action"] in frees:
            if e["addr"] in addr_to_alloc:
                del addr_to_alloc[e["addr"]]
            else:
                initially.append(e)
    live = set(addr_to_alloc)
    for seg in data["segments"]:
        if seg["device"] != device:
            continue
        if plot_segments:
            if seg["address"] not in addr_to_alloc:
                live.add(seg["address"])
        else:
            for b in seg["blocks"]:
                if b["state"] == "active_allocated" and b["addr"] not in addr_to_alloc:
                    need(is_int(b["requested_size"]), "requested_size")
                    live.add(b["addr"])
    return live


def memory_view_walk(data, traces, device):
    """MemoryView: from the snapshot's segments and active blocks, undo the
    events newest first (simulate_memory) and, for every selectable event,
    place each block in a segment (draw's find_segment); a failure there is a
    TypeError in the page."""
    segs = [{"addr": s["address"], "size": s["total_size"], "stream": s["stream"]}
            for s in data["segments"] if s["device"] == device]
    segs.sort(key=lambda s: s["addr"])
    blocks = {b["addr"]: b["size"] for s in data["segments"] if s["device"] == device for b in s["blocks"]
              if b["state"] in ("active_pending_free", "active_allocated")}
    events = traces[device]

    def find_index(pred):
        return next((i for i, s in enumerate(segs) if pred(s)), -1)

    def map_segment(merge, seg):
        idx = find_index(lambda e: e["addr"] > seg["addr"])
        if not merge:
            segs.insert(idx if idx >= 0 else len(segs) - 1, seg)  # JS splice(-1, 0, x): before the last
            return
        if idx == -1:
            idx = len(segs)
        segs.insert(idx, seg)
        if idx + 1 < len(segs):
            nxt = segs[idx + 1]
            if seg["addr"] + seg["size"] == nxt["addr"] and seg["stream"] == nxt["stream"]:
                seg["size"] += nxt["size"]
                del segs[idx + 1]
        if idx > 0:
            prev = segs[idx - 1]
            if prev["addr"] + prev["size"] == seg["addr"] and prev["stream"] == seg["stream"]:
                prev["size"] += seg["size"]
                del segs[idx]

    def unmap_segment(merge, seg, where):
        if not merge:
            idx = find_index(lambda x: x["addr"] == seg["addr"])
            need(idx >= 0, f"device {device}, {where}: segment_alloc of {seg['addr']:#x}, which is no segment "
                 "(the page would drop another)")
            del segs[idx]
            return
        end = seg["addr"] + seg["size"]
        idx = find_index(lambda e: e["addr"] <= seg["addr"] and end <= e["addr"] + e["size"])
        need(idx >= 0, f"device {device}, {where}: segment_map of {seg['addr']:#x} inside no segment (TypeError)")
        ex = segs[idx]
        ex_end = ex["addr"] + ex["size"]
        if ex["addr"] == seg["addr"]:
            ex["addr"] += seg["size"]
            ex["size"] -= seg["size"]
            if ex["size"] == 0:
                del segs[idx]
        elif ex_end == end:
            ex["size"] -= seg["size"]
        else:
            ex["size"] = seg["addr"] - ex["addr"]
            segs.insert(idx + 1, {"addr": end, "size": ex_end - end, "stream": seg["stream"]})

    def draw(where):
        by_addr = sorted(segs, key=lambda s: s["addr"])
        starts = [s["addr"] for s in by_addr]
        for b in blocks:
            i = bisect.bisect_right(starts, b) - 1
            need(i >= 0 and b < by_addr[i]["addr"] + by_addr[i]["size"],
                 f"device {device}, {where}: block {b:#x} lies in no segment (TypeError in draw)")

    draw(f"event {len(events) - 1}" if events else "no events")
    for i in range(len(events) - 1, 0, -1):  # state for idx = i - 1: events i.. undone
        e = events[i]
        act = e["action"]
        if act == "free":
            blocks[e["addr"]] = e["size"]
        elif act == "free_requested":
            need(e["addr"] in blocks, f"device {device}, event {i}: free_requested of {e['addr']:#x}, "
                 "no such block (TypeError)")
        elif act == "free_completed":
            blocks[e["addr"]] = e["size"]
        elif act == "alloc":
            blocks.pop(e["addr"], None)
        elif act in ("segment_free", "segment_unmap"):
            map_segment(act == "segment_unmap", {"addr": e["addr"], "size": e["size"], "stream": e["stream"]})
        elif act in ("segment_alloc", "segment_map"):
            unmap_segment(act == "segment_map", {"addr": e["addr"], "size": e["size"], "stream": e["stream"]},
                          f"event {i}")
        draw(f"event {i - 1}")


def check_memoryviz(data, dropped):
    data = pickle.loads(pickle.dumps(data))  # annotate mutates
    traces = annotate(data)
    has_segments = {s["device"] for s in data["segments"]}
    shown = [i for i, t in enumerate(traces) if t or i in has_segments]  # the page's device list
    need(shown, "the page would list no device")
    for dev in shown:
        live = process_alloc_data(data, traces, dev, False)
        process_alloc_data(data, traces, dev, True)
        # live at the end: the allocated blocks, and the pending ones whose
        # free the trace shows as requested only
        last = {}
        for e in traces[dev]:
            if e["action"] in ("alloc", "free", "free_requested", "free_completed"):
                last[e["addr"]] = e["action"]
        active = {b["addr"] for s in data["segments"] if s["device"] == dev for b in s["blocks"]
                  if b["state"] == "active_allocated"
                  or (b["state"] == "active_pending_free" and last.get(b["addr"]) == "free_requested")}
        if not dropped:
            need(live == active, f"device {dev}: the Active Memory Timeline ends with {len(live)} blocks live, "
                 f"the snapshot has {len(active)} active")
        memory_view_walk(data, traces, dev)
    print(f"ok MemoryViz.js (emulated): devices {shown} listed; timelines end at the snapshot; "
          "Allocator State History places every block at every event")


# --- 5. PyTorch ---------------------------------------------------------------

def check_torch(path, data, mode, html_dir):
    """Returns False when PyTorch could not be imported (--torch auto)."""
    if mode == "skip":
        print("skip torch: --torch skip")
        return True
    try:
        import torch.cuda._memory_viz as mv  # noqa: F401
    except Exception as e:  # ImportError, or a torch that cannot load
        need(mode != "require", f"cannot import torch.cuda._memory_viz: {e}")
        print(f"skip torch: cannot import torch.cuda._memory_viz ({type(e).__name__})")
        return False
    import torch.cuda._memory_viz as mv
    ident = lambda lines: lines  # no flamegraph.pl download
    for name, out in (("trace_plot", mv.trace_plot(data)), ("trace_plot(plot_segments)", mv.trace_plot(data, plot_segments=True)),
                      ("segment_plot", mv.segment_plot(data))):
        need("snapshot.pickle" in out and len(out) > 1000, f"_memory_viz.{name}: unexpected HTML")
    need("total_reserved" in mv.segsum(data), "_memory_viz.segsum")
    mv.trace(data)
    need(mv.segments(data, format_flamegraph=ident) is not None, "_memory_viz.segments")
    need(mv.memory(data, format_flamegraph=ident) is not None, "_memory_viz.memory")
    tmp = tempfile.TemporaryDirectory()
    outdir = html_dir or tmp.name
    for cmd in ("trace_plot", "segment_plot"):
        html = os.path.join(outdir, f"{cmd}.html")
        r = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", cmd, path, "-o", html],
                           capture_output=True, text=True)
        need(r.returncode == 0, f"python -m torch.cuda._memory_viz {cmd}: {r.returncode}: {r.stderr[-2000:]}")
        size = os.path.getsize(html)
        need(size > 2000, f"{html}: only {size} bytes")
        with open(html) as f:
            page = f.read()
        need("add_local_files" in page, f"{html} is not memory_viz's page")
        # the page carries the snapshot base64-encoded (padded with zeros to whole triples)
        m = re.search(r"const local_files = (\[.*\])", page)
        need(m is not None, f"{html}: no embedded snapshot")
        raw = base64.b64decode(json.loads(m.group(1))[0]["base64"]).rstrip(b"\0")
        need(pickle.loads(raw) == data, f"{html}: the embedded snapshot is not the pickle's")
        proto = next(pickletools.genops(raw))[1]
        if proto > 4:  # _memory_viz pickles with Python's default protocol (5 from Python 3.14)
            print(f"note: {html} embeds a protocol {proto} pickle, which MemoryViz.js refuses (it reads 2 to 4): "
                  "a PyTorch/Python matter, the same for PyTorch's own snapshots")
    tmp.cleanup()
    where = f" into {html_dir}" if html_dir else ""
    print(f"ok torch {getattr(__import__('torch'), '__version__', '?')}: _memory_viz trace_plot, segment_plot, "
          f"segsum, trace, segments, memory; the command lines wrote HTML{where} embedding this snapshot")
    return True


def main():
    p = argparse.ArgumentParser()
    p.add_argument("pickle")
    p.add_argument("snapshot")
    p.add_argument("trace", nargs="?")
    p.add_argument("--expect", action="append", default=[])
    p.add_argument("--torch", choices=("auto", "require", "skip"), default="auto")
    p.add_argument("--html-dir")
    a = p.parse_args()
    with open(a.pickle, "rb") as f:
        raw = f.read()
    with open(a.snapshot) as f:
        snap = json.load(f)
    trace = None
    if a.trace:
        with open(a.trace) as f:
            trace = json.load(f)
    try:
        check_opcodes(raw)
        data = pickle.loads(raw)
        check_structure(data)
        check_faithful(data, snap, trace)
        dropped = bool(trace and trace.get("otherData", {}).get("dropped_events"))
        check_memoryviz(data, dropped)
        for what in a.expect:
            blocks = [b for s in data["segments"] for b in s["blocks"]]
            acts = [e for t in data["device_traces"] for e in t]
            if what == "pending":
                need(any(b["state"] == "active_pending_free" for b in blocks), "expected an active_pending_free block")
                for t in data["device_traces"]:
                    lone = [e for i, e in enumerate(t) if e["action"] == "free_requested"
                            and not (i + 1 < len(t) and t[i + 1]["action"] == "free_completed")]
                    pend = {b["address"] for s in data["segments"] for b in s["blocks"] if b["state"] == "active_pending_free"}
                    need({e["addr"] for e in lone} <= pend, "a lone free_requested for a block not pending")
                need(any(e["action"] == "free_requested" for e in acts), "expected free_requested entries")
            elif what == "expandable":
                need(any(s["is_expandable"] for s in data["segments"]), "expected an expandable segment")
                need(any(e["action"] == "segment_map" for e in acts), "expected segment_map entries")
                need(data["allocator_settings"]["expandable_segments"] is True, "allocator_settings.expandable_segments")
            elif what == "classic":
                need(not any(s["is_expandable"] for s in data["segments"]), "expected no expandable segment")
                need(any(e["action"] == "segment_alloc" for e in acts), "expected segment_alloc entries")
            elif what == "oom":
                need(any(e["action"] == "oom" for e in acts), "expected an oom entry")
            elif what.startswith("devices="):
                n = int(what.split("=", 1)[1])
                need(len(data["device_traces"]) == n, f"expected {n} device_traces lists")
                need({s["device"] for s in data["segments"]} == set(range(n)), f"expected segments on devices 0..{n - 1}")
                need(all(t for t in data["device_traces"]), "expected trace entries on every device")
            else:
                raise Failed(f"unknown --expect {what}")
        if a.expect:
            print(f"ok expected: {', '.join(a.expect)}")
        torch_ran = check_torch(a.pickle, data, a.torch, a.html_dir)
    except Failed as e:
        print(f"FAIL: {e}")
        return 1
    return 0 if torch_ran else 77


if __name__ == "__main__":
    sys.exit(main())
