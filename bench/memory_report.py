#!/usr/bin/env python3
"""memory_report.py — the memory table of issue 8 (item 4): for each program
and setting, what cachalloc would reserve (its trace replayed through the core
on the fake backend by bench/trace_replay) beside what PyTorch's own allocator
reserved on the same program (torch.cuda.memory_stats()).

    memory_report.py --replay REPLAY.json --torch TORCH_STATS... [--cachalloc-stats DUMP.json...] [-o OUT.md]
    memory_report.py --traces TRACE... [--trace-replay BIN] --torch ... [-o OUT.md]

--replay      what `trace_replay --json` wrote (bench/record-traces.sh does it)
--traces      traces to replay here instead (.json, .json.gz, .replay.gz), with
              BIN (default build-h4/bench/trace_replay, else build/bench/trace_replay)
--torch       files holding TORCH_MEMORY_STATS lines (bench/programs/mem_stats.py
              output: logs or the torch-stats.jsonl record-traces.sh collects)
--cachalloc-stats  stats dumps of the recorded runs (CACHALLOC_CONF=stats:PATH),
              named like their traces (NAME-PID.stats.json): the recorded run's
              own peaks, requested bytes included

Figures (the same definitions on both sides, from the allocators' statistics):
  reserved ÷ allocated = reserved_bytes.all.peak / allocated_bytes.all.peak
  fragmentation        = 1 - active_bytes.all.peak / reserved_bytes.all.peak
  device allocs        = num_device_alloc (cudaMalloc calls; pages mapped for
                         expandable segments)
A program is a trace's file name without its -PID suffix; settings are matched
by their text, case and spaces ignored (PyTorch writes True, cachalloc true).
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

MiB = 1 << 20


def norm(conf):
    return re.sub(r"\s+", "", conf or "").lower()


def setting_name(conf):
    return conf if conf else "classic (defaults)"


def program_of(stem):
    return re.sub(r"-\d+$", "", stem)


def stem_of(path):
    b = os.path.basename(path)
    for suffix in (".gz", ".replay", ".json", ".stats"):
        if b.endswith(suffix):
            b = b[: -len(suffix)]
    return b


def mib(b):
    return "—" if b is None else f"{b / MiB:,.1f}"


def fmt(v, digits=3):
    return "—" if v is None else f"{v:.{digits}f}"


def ratio(a, b):
    return a / b if a is not None and b else None


def frag(active, reserved):
    return 1 - active / reserved if active is not None and reserved else None


def load_torch(paths):
    """{(program, normalized setting): entry}; the last line of a pair wins."""
    out = {}
    for pattern in paths:
        for path in sorted(glob.glob(pattern)) or [pattern]:
            try:
                with open(path, errors="replace") as f:
                    lines = f.readlines()
            except OSError as e:
                print(f"memory_report: {path}: {e}", file=sys.stderr)
                continue
            for line in lines:
                if not line.startswith("TORCH_MEMORY_STATS "):
                    continue
                try:
                    e = json.loads(line.split(" ", 1)[1])
                except ValueError:
                    continue
                if not e.get("caching", True):
                    continue  # PyTorch's cache was off (the cachalloc run): nothing to compare
                out[(e["program"], norm(e.get("setting", e.get("alloc_conf", ""))))] = e
    return out


def load_dumps(paths):
    """{stem: {device: stats}} from cachalloc stats dumps."""
    out = {}
    for pattern in paths:
        for path in sorted(glob.glob(pattern)) or [pattern]:
            try:
                with open(path) as f:
                    d = json.load(f)
            except (OSError, ValueError) as e:
                print(f"memory_report: {path}: {e}", file=sys.stderr)
                continue
            out[stem_of(path)] = {dev.get("device", 0): dev.get("stats", {}) for dev in d.get("devices", [])}
    return out


def default_replay_bin():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for b in ("build-h4", "build", "build-gpu"):
        p = os.path.join(here, b, "bench", "trace_replay")
        if os.path.exists(p):
            return p
    return "trace_replay"


def run_replay(traces, binary):
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        r = subprocess.run([binary, "--quiet", "--json", path] + traces, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
        if r.stderr:
            sys.stderr.write(r.stderr)
        with open(path) as f:
            return json.load(f)
    finally:
        os.unlink(path)


def row(cells):
    return "| " + " | ".join(str(c) for c in cells) + " |"


HEADER = ["program", "setting",
          "replay: peak reserved (MiB)", "replay: reserved ÷ allocated", "replay: fragmentation",
          "replay: device allocs",
          "PyTorch: peak reserved (MiB)", "PyTorch: reserved ÷ allocated", "PyTorch: fragmentation",
          "PyTorch: device allocs"]


def torch_cells(e):
    if e is None:
        return ["—"] * 4
    s = e["stats"]
    res, alloc, act = s.get("reserved_bytes.all.peak"), s.get("allocated_bytes.all.peak"), s.get("active_bytes.all.peak")
    return [mib(res), fmt(ratio(res, alloc)), fmt(frag(act, res)), s.get("num_device_alloc", "—")]


def report(replay, torch, dumps):
    lines = ["# Memory: cachalloc (trace replayed on the fake backend) beside PyTorch's allocator", ""]
    lines += ["Replay figures: the program's allocation sequence recorded under cachalloc "
              "(`trace:`), replayed through the core with each setting (bench/trace_replay). "
              "PyTorch figures: the same program on PyTorch's own allocator with the same setting "
              "(`torch.cuda.memory_stats()`, whole run). "
              "reserved ÷ allocated = reserved_bytes.all.peak / allocated_bytes.all.peak; "
              "fragmentation = 1 − active_bytes.all.peak / reserved_bytes.all.peak (the two peaks may "
              "fall at different times); device allocs = num_device_alloc.", ""]
    lines += [row(HEADER), row(["---", "---"] + ["---:"] * (len(HEADER) - 2))]
    notes = []
    seen_torch = set()
    traces = replay.get("traces", [])
    for t in traces:
        stem = t["name"]
        prog = program_of(stem)
        label = prog if sum(program_of(x["name"]) == prog for x in traces) == 1 else stem
        if t.get("device", 0) != 0 or any(x["name"] == stem and x.get("device", 0) != 0 for x in traces):
            label += f" (device {t.get('device', 0)})"
        dump = dumps.get(stem, {}).get(t.get("device", 0))
        if dump:
            res, alloc, act = (dump.get("reserved_bytes.all.peak"), dump.get("allocated_bytes.all.peak"),
                               dump.get("active_bytes.all.peak"))
            lines.append(row([label, "recorded run (cachalloc defaults, its stats dump)", mib(res),
                              fmt(ratio(res, alloc)), fmt(frag(act, res)), dump.get("num_device_alloc", "—"),
                              "", "", "", ""]))
        for s in t["settings"]:
            key = (prog, norm(s["conf"]))
            e = torch.get(key)
            if e is not None:
                seen_torch.add(key)
            lines.append(row([label, setting_name(s["conf"]) + (f" (ERROR {s['error']})" if s.get("error") else ""),
                              mib(s["peak_reserved"]), fmt(s["reserved_over_allocated"]), fmt(s["fragmentation"]),
                              s["num_device_alloc"]] + torch_cells(e)))
        # PyTorch settings the replay did not run
        for (p, conf), e in sorted(torch.items()):
            if p == prog and (p, conf) not in seen_torch and all(norm(s["conf"]) != conf for s in t["settings"]):
                lines.append(row([label, setting_name(e.get("setting") or e.get("alloc_conf", "")) + " (PyTorch only)",
                                  "—", "—", "—", "—"] + torch_cells(e)))
                seen_torch.add((p, conf))
        n = [f"**{label}**: {t['events']} events, {t['allocs']} allocations, {t['frees']} frees; "
             f"peak of traced sizes live at once {mib(t['trace_peak_live'])} MiB"]
        if not t.get("other_data"):
            n.append("the trace has no otherData: whether its ring dropped events is unknown")
        elif t.get("dropped_events"):
            n.append(f"INCOMPLETE: the ring dropped the {t['dropped_events']} oldest events "
                     f"(trace_max_entries {t['trace_max_entries']}); {mib(t['recorded']['start_allocated'])} MiB "
                     "were allocated before the first kept event and are not replayed")
        if t.get("skipped_frees"):
            n.append(f"{t['skipped_frees']} frees of addresses never allocated in the trace skipped")
        if t.get("requested_sizes", 0) < t["allocs"]:
            n.append("sizes replayed are cachalloc's block sizes as traced (512 B rounding, or a whole unsplit "
                     "block), not the program's requests")
        if dump and dump.get("requested_bytes.all.peak"):
            req, alloc = dump["requested_bytes.all.peak"], dump.get("allocated_bytes.all.peak")
            n.append(f"the recorded run's requested_bytes.all.peak {mib(req)} MiB, allocated {mib(alloc)} MiB")
        rec = t.get("recorded", {})
        classic = next((s for s in t["settings"] if s["conf"] == ""), None)
        if classic and rec.get("peak_reserved") and classic["peak_reserved"] != rec["peak_reserved"]:
            n.append(f"the classic replay reserves {mib(classic['peak_reserved'])} MiB at peak where the recorded "
                     f"run reserved {mib(rec['peak_reserved'])} MiB (fences completing at once, and dropped events, "
                     "make them differ)")
        if len(t.get("streams", [])) > 1:
            n.append(f"streams in the trace: {', '.join(hex(x) for x in t['streams'])}")
        e0 = torch.get((prog, ""))
        if e0 and e0["stats"].get("requested_bytes.all.peak"):
            n.append(f"PyTorch's requested_bytes.all.peak {mib(e0['stats']['requested_bytes.all.peak'])} MiB")
        notes.append("; ".join(n) + ".")
    # programs PyTorch ran that have no trace at all
    for (p, conf), e in sorted(torch.items()):
        if (p, conf) in seen_torch or any(program_of(t["name"]) == p for t in traces):
            continue
        lines.append(row([p, setting_name(e.get("setting", "")) + " (no trace)", "—", "—", "—", "—"] + torch_cells(e)))
    lines += ["", "Notes:", ""] + [f"- {x}" for x in notes]
    lines += ["- Frees are replayed on the block's own stream with cross-stream fences completing at once; under "
              "cachalloc with `PYTORCH_NO_CUDA_MEMORY_CACHING=1` every tensor is a plain cudaMalloc, so the trace "
              "has one stream (the shim's 0x2) even where PyTorch's allocator keeps a pool per stream.",
              "- The replay device is the fake backend (80 GiB unless trace_replay was given "
              "--device-total-gib): retries and OOMs stay 0 unless a program needs more."]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replay", help="trace_replay --json output")
    ap.add_argument("--traces", nargs="*", default=[], help="traces to replay here")
    ap.add_argument("--trace-replay", default=None, help="the trace_replay binary")
    ap.add_argument("--torch", nargs="*", default=[], help="files with TORCH_MEMORY_STATS lines")
    ap.add_argument("--cachalloc-stats", nargs="*", default=[], help="stats dumps of the recorded runs")
    ap.add_argument("-o", "--output", help="write the markdown here (also printed)")
    a = ap.parse_args()
    if a.replay:
        try:
            with open(a.replay) as f:
                replay = json.load(f)
        except (OSError, ValueError) as e:
            print(f"memory_report: {a.replay}: {e}", file=sys.stderr)
            replay = {"traces": []}
    elif a.traces:
        replay = run_replay(a.traces, a.trace_replay or default_replay_bin())
    else:
        replay = {"traces": []}
    text = report(replay, load_torch(a.torch), load_dumps(a.cachalloc_stats))
    if a.output:
        with open(a.output, "w") as f:
            f.write(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
