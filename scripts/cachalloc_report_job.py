# cachalloc_report_job.py — `cachalloc-report job DIR`: the statistics dumps
# of every rank of a job (stats:DIR/stats-%r.json) merged into one report.
#
#   cachalloc-report job DIR [--plot FILE.png]
#
# One row per rank and device: peak reserved, peak allocated, their
# difference, out-of-memory errors, fence waits and fence joins; then the
# job: its ranks (and those of the world size that wrote no dump), the
# imbalance of peak reserved (max/median, and whose is the max), totals.
# --plot draws each rank's reserved bytes over time from the trace files in
# DIR (trace:DIR/trace-%r.json), matched to the dumps by pid.
#
# The dump says which rank wrote it ("rank", "world_size", "job": the
# launcher's variables, core/obs/path_template.h); a dump without a rank
# (no launcher variable set, or an older cachalloc) is shown by its pid.
# Only DIR's *.json files are read; hidden ones are cachalloc's temporary
# files of a rank still writing.  Files that are not stats dumps are named
# in a warning and skipped (traces and snapshots silently: they belong there).
#
# Imported by scripts/cachalloc-report, which it sits beside (scripts/, the
# installed bin/, the Python package); standard library only.  The plot
# reuses the tool's trace reader and axis units: `tool` below is the tool's
# module, passed in (cachalloc-report, with no .py, cannot be imported by name).
import json
import os
import statistics
import sys

COLUMNS = [("rank", "label", "<"), ("host", "host", "<"), ("pid", "pid", ">"), ("device", "device", ">"),
           ("peak reserved", "peak_reserved", ">"), ("peak allocated", "peak_allocated", ">"),
           ("reserved-allocated", "unallocated", ">"), ("OOMs", "ooms", ">"),
           ("fence waits", "fence_waits", ">"), ("fence joins", "fence_joins", ">")]
SIZE_FIELDS = ("peak_reserved", "peak_allocated", "unallocated")


def warn(message):
    print(f"cachalloc-report: warning: {message}", file=sys.stderr)


def size_text(n):
    """Bytes in binary units, two decimals: the table is read by people."""
    for unit, div in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n} B"


# --- reading the folder -------------------------------------------------------

def kind_of(doc):
    """"stats", "trace", "snapshot", or None for JSON that is none of them."""
    if not isinstance(doc, dict):
        return None
    if isinstance(doc.get("traceEvents"), list):
        return "trace"
    devices = doc.get("devices")
    if "version" not in doc or not isinstance(devices, list) or not all(isinstance(d, dict) for d in devices):
        return None
    if "interposer" in doc and all(isinstance(d.get("stats"), dict) for d in devices):
        return "stats"
    if all("segments" in d for d in devices):
        return "snapshot"
    return None


def read_folder(folder):
    """([(path, stats dump)], [(path, trace)]) of the folder's *.json files,
    each other one named in a warning; exits if the folder cannot be listed."""
    try:
        names = sorted(os.listdir(folder))
    except OSError as e:
        sys.exit(f"cachalloc-report: cannot list {folder}: {e.strerror}")
    dumps, traces = [], []
    for name in names:
        path = os.path.join(folder, name)
        if name.startswith(".") or not name.endswith(".json") or not os.path.isfile(path):
            continue
        try:
            with open(path) as f:
                doc = json.load(f)
        except ValueError as e:  # UnicodeDecodeError too
            warn(f"{path} is not valid JSON (truncated?): {e}; skipped")
            continue
        except OSError as e:
            warn(f"cannot read {path}: {e.strerror}; skipped")
            continue
        kind = kind_of(doc)
        if kind == "stats":
            dumps.append((path, doc))
        elif kind == "trace":
            traces.append((path, doc))
        elif kind is None:
            warn(f"{path} is not a cachalloc stats dump; skipped")
    return dumps, traces


# --- the rows -------------------------------------------------------------------

def rank_of(doc):
    """The dump's rank, or None (no launcher variable; a dump older than the field)."""
    rank = doc.get("rank")
    return rank if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0 else None


def label_of(doc):
    rank = rank_of(doc)
    return str(rank) if rank is not None else f"pid {doc.get('pid', '?')}"


def device_row(base, dev):
    s = dev["stats"]
    reserved, allocated = s.get("reserved_bytes.all.peak", 0), s.get("allocated_bytes.all.peak", 0)
    # Both peaks are in the dump, not what was allocated when the reservation
    # peaked; since allocated <= reserved at every moment, reserved peak -
    # allocated peak is a lower bound of the reserve left unallocated then.
    return dict(base, device=dev.get("device", "?"), peak_reserved=reserved, peak_allocated=allocated,
                unallocated=max(reserved - allocated, 0), ooms=s.get("num_ooms", 0),
                fence_waits=s.get("num_fence_waits", 0), fence_joins=s.get("num_fence_joins", 0))


def rows_of(path, doc):
    """One row per device of the dump; one row with device "-" for a process
    that reserved on none, so that the rank is still seen."""
    base = {"file": path, "rank": rank_of(doc), "label": label_of(doc), "pid": doc.get("pid", "?"),
            "host": doc.get("host", "?")}
    rows = [device_row(base, dev) for dev in doc["devices"]]
    if not rows:
        rows.append(dict(base, device="-", peak_reserved=0, peak_allocated=0, unallocated=0, ooms=0,
                         fence_waits=0, fence_joins=0, no_device=True))
    return rows


def sort_key(row):
    pid = row["pid"] if isinstance(row["pid"], int) else -1
    device = row["device"] if isinstance(row["device"], int) else -1
    return (row["rank"] is None, row["rank"] or 0, pid, device)


def table_text(rows):
    cells = [[size_text(r[k]) if k in SIZE_FIELDS else str(r[k]) for _, k, _ in COLUMNS] for r in rows]
    widths = [max([len(title)] + [len(c[i]) for c in cells]) for i, (title, _, _) in enumerate(COLUMNS)]
    lines = ["  ".join(f"{title:{align}{w}}" for (title, _, align), w in zip(COLUMNS, widths)).rstrip()]
    for c in cells:
        lines.append("  ".join(f"{v:{align}{w}}" for v, (_, _, align), w in zip(c, COLUMNS, widths)).rstrip())
    return "\n".join(lines) + "\n"


# --- the job ----------------------------------------------------------------------

def ranges_text(numbers):
    """[0, 1, 2, 5] -> "0-2, 5"."""
    parts, numbers = [], sorted(numbers)
    i = 0
    while i < len(numbers):
        j = i
        while j + 1 < len(numbers) and numbers[j + 1] == numbers[j] + 1:
            j += 1
        parts.append(str(numbers[i]) if i == j else f"{numbers[i]}-{numbers[j]}")
        i = j + 1
    return ", ".join(parts)


def mixed_job_warnings(dumps, folder):
    """Warnings for dumps that cannot all be of one run of one job."""
    jobs, by_rank = {}, {}
    for path, doc in dumps:
        if doc.get("job"):
            jobs.setdefault(doc["job"], []).append(os.path.basename(path))
        if rank_of(doc) is not None:
            by_rank.setdefault(rank_of(doc), []).append(os.path.basename(path))
    if len(jobs) > 1:
        warn(f"the dumps in {folder} come from {len(jobs)} jobs: "
             + "; ".join(f"{job}: {', '.join(files)}" for job, files in sorted(jobs.items()))
             + "; the job lines mix them")
    for rank, files in sorted(by_rank.items()):
        if len(files) > 1:
            warn(f"rank {rank} wrote {len(files)} dumps ({', '.join(files)}): dumps of different jobs or runs "
                 f"mixed in {folder}?")
    sizes = sorted({doc["world_size"] for _, doc in dumps if isinstance(doc.get("world_size"), int)})
    if len(sizes) > 1:
        warn(f"the dumps disagree on the world size ({', '.join(map(str, sizes))}): more than one job?")


def ranks_line(dumps, rows):
    ranks = sorted({rank_of(doc) for _, doc in dumps if rank_of(doc) is not None})
    unranked = sum(1 for _, doc in dumps if rank_of(doc) is None)
    hosts = len({r["host"] for r in rows})
    what = [f"rank{'s' if len(ranks) != 1 else ''} {ranges_text(ranks)}"] if ranks else []
    if unranked:
        what.append(f"{unranked} process{'es' if unranked != 1 else ''} without a rank")
    sizes = {doc["world_size"] for _, doc in dumps if isinstance(doc.get("world_size"), int)}
    world = ""
    if len(sizes) == 1:
        size = sizes.pop()
        missing = sorted(set(range(size)) - set(ranks))
        world = (f"; world size {size}: no dump from rank {ranges_text(missing)} (a rank that dies before "
                 f"exit() writes none)" if missing else f"; world size {size}, every rank wrote a dump")
    return (f"job: {len(dumps)} dump{'s' if len(dumps) != 1 else ''} ({', '.join(what)}) on {hosts} "
            f"host{'s' if hosts != 1 else ''}{world}")


def where_text(row):
    who = f"rank {row['label']}" if row["rank"] is not None else row["label"]
    return f"{who} ({row['host']}), device {row['device']}"


def imbalance_line(rows):
    live = [r for r in rows if not r.get("no_device")]
    if not live:
        return "job: peak reserved imbalance: - (no process used a device)"
    top = max(live, key=lambda r: r["peak_reserved"])  # the first of equal peaks, in table order
    median = statistics.median(r["peak_reserved"] for r in live)
    if median == 0:
        return (f"job: peak reserved imbalance: - (the median is 0); the largest: {where_text(top)}, "
                f"{size_text(top['peak_reserved'])}")
    return (f"job: peak reserved imbalance (max/median over {len(live)} rank-device rows): "
            f"{top['peak_reserved'] / median:.2f}; the max: {where_text(top)}, {size_text(top['peak_reserved'])}; "
            f"the median: {size_text(median)}")


def totals_line(rows):
    total = {k: sum(r[k] for r in rows) for k in ("peak_reserved", "peak_allocated", "ooms", "fence_waits",
                                                  "fence_joins")}
    return (f"job: totals: peak reserved {size_text(total['peak_reserved'])}, peak allocated "
            f"{size_text(total['peak_allocated'])} (sums of each row's peak: the peaks need not coincide), "
            f"out-of-memory errors {total['ooms']}, fence waits {total['fence_waits']}, "
            f"fence joins {total['fence_joins']}")


LEGEND = """\
reserved-allocated: peak reserved minus peak allocated, at least what was reserved but not
  allocated when the reservation peaked (the dump has no allocated figure for that moment).
OOMs: num_ooms; fence waits: num_fence_waits (misses that waited on the host for freed blocks);
  fence joins: num_fence_joins (misses that made later work wait for them on the device).
"""


# --- the plot ----------------------------------------------------------------------

def trace_pid(trace):
    for ev in trace["traceEvents"]:
        if isinstance(ev, dict) and "pid" in ev:
            return ev["pid"]
    return None


def plot_lines(dumps, traces, tool):
    """[(label, ([t_s], [bytes]))] of reserved bytes, one per rank and device."""
    by_pid = {}
    for _, doc in dumps:
        by_pid.setdefault(doc.get("pid"), []).append(doc)
    lines = []
    for path, trace in traces:
        pid = trace_pid(trace)
        owners = by_pid.get(pid, [])
        if len(owners) != 1:
            why = "no stats dump" if not owners else f"{len(owners)} stats dumps (pids of two hosts?)"
            warn(f"{path}: {why} of process {pid} in the folder; left out of the plot")
            continue
        series = tool.counter_series(trace)
        for dev in sorted(series):
            if "reserved" in series[dev]:
                label = label_of(owners[0])
                label = f"rank {label}" if rank_of(owners[0]) is not None else label
                lines.append((f"{label} device {dev}" if len(series) > 1 else label, series[dev]["reserved"]))
    return lines


def draw(lines, output, plt, dropped, tool):
    peak = max(max(ys) for _, (_, ys) in lines)
    span = max(max(xs) for _, (xs, _) in lines)
    unit, div, tunit, tmul = tool.axis_units(peak, span)
    fig, ax = plt.subplots(figsize=(10, 5))
    for label, (xs, ys) in lines:
        ax.step([x * tmul for x in xs], [y / div for y in ys], where="post", label=label)
    # Each trace counts time from its own oldest kept event: the ranks'
    # clocks cannot be lined up, only their shapes compared.
    ax.set_xlabel(f"time since each rank's first traced event ({tunit})")
    ax.set_ylabel(f"reserved ({unit})")
    title = "cachalloc: reserved memory per rank"
    if dropped:
        title += f" ({dropped} of the traces dropped their oldest events)"
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", ncol=1 + len(lines) // 16)
    fig.tight_layout()
    fig.savefig(output, dpi=100)


def plot(dumps, traces, output, plt, tool):
    """Writes the plot; returns an error message or None."""
    if plt is None:
        return ("--plot needs matplotlib (apt-get install python3-matplotlib, or pip install matplotlib); "
                "the report above is complete")
    if not traces:
        return ("--plot: no trace in the folder (add trace:DIR/trace-%r.json to CACHALLOC_CONF); "
                "the report above is complete")
    lines = plot_lines(dumps, traces, tool)
    if not lines:
        return "--plot: no trace of these processes has reserved-bytes counters"
    dropped = sum(1 for _, t in traces if t.get("otherData", {}).get("dropped_events"))
    try:
        draw(lines, output, plt, dropped, tool)
    except OSError as e:
        return f"cannot write {output}: {e.strerror}"
    print(f"wrote {output}: reserved memory of {len(lines)} rank-device lines")
    return None


# --- the command ---------------------------------------------------------------------

def run(folder, plot_output, plt, tool):
    """`cachalloc-report job`: prints the report; returns the exit status.
    plt is matplotlib.pyplot (None without it) when plot_output is given."""
    dumps, traces = read_folder(folder)
    if not dumps:
        print(f"cachalloc-report: no cachalloc stats dump in {folder} (write one per rank with "
              f"stats:{os.path.join(folder, 'stats-%r.json')} in CACHALLOC_CONF)", file=sys.stderr)
        return 1
    mixed_job_warnings(dumps, folder)
    unranked = [os.path.basename(p) for p, doc in dumps if rank_of(doc) is None]
    if unranked:
        warn(f"{len(unranked)} dump{'s carry' if len(unranked) != 1 else ' carries'} no rank ({', '.join(unranked)}: "
             f"written with no launcher's rank variable set, or by an older cachalloc): shown by pid")
    rows = sorted((row for path, doc in dumps for row in rows_of(path, doc)), key=sort_key)
    print(f"cachalloc job report: {folder}")
    sys.stdout.write(table_text(rows))
    print(ranks_line(dumps, rows))
    print(imbalance_line(rows))
    print(totals_line(rows))
    sys.stdout.write(LEGEND)
    if plot_output is None:
        return 0
    sys.stdout.flush()
    error = plot(dumps, traces, plot_output, plt, tool)
    if error:
        print(f"cachalloc-report: {error}", file=sys.stderr)
        return 1
    return 0
