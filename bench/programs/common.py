"""common.py — what the real programs of bench/run-all.sh share.

* determinism(): fixed seeds, deterministic algorithms, no TF32, so losses
  can be compared bit for bit across allocators;
* PeakSampler: device memory peak from NVML (libnvidia-ml.so.1 through
  ctypes; pynvml is not needed), else `nvidia-smi -lms`, else
  torch.cuda.mem_get_info polled at each step end;
* CachallocCounters: cachalloc's own statistics (calls, time inside it,
  driver calls) read in-process through its control API
  (cachalloc_stats_json, include/cachalloc.h), so a phase reports exactly
  its timed steps; absent without cachalloc;
* StepTimer and emit(): the output lines every program prints;
* import_torch() and start_measuring(): every program's start-up;
  measure_one(): a one-phase program's whole run, measured and emitted.

Output lines (one phase of one program):
    LOSS program=NAME step=I value=REPR hex=HEX
    STEP_MS program=NAME median=X min=X max=X n=N
    PEAK program=NAME bytes=N source=nvml|nvidia-smi|mem_get_info
    RESULT {json}            everything above, machine-readable (run_bench.py reads it)
"""
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS


def determinism(seed=0):
    import torch

    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def allocator_label():
    # by the preloaded files' names (a path's folders may say anything)
    pre = " ".join(os.path.basename(x) for x in os.environ.get("LD_PRELOAD", "").replace(":", " ").split())
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if os.environ.get("BENCH_CACHALLOC_PLUGGABLE"):
        return "cachalloc_pluggable"
    if "backend:cudaMallocAsync" in conf:
        return "cachalloc_async" if "cachalloc" in pre else "cudapool"
    if "cachalloc" in pre:
        exp = "expandable_segments:true" in os.environ.get("CACHALLOC_CONF", "")
        return "cachalloc_expandable" if exp else "cachalloc"
    return "native_expandable" if "expandable_segments:True" in conf else "native"


# --- device memory peak --------------------------------------------------------------

class _Nvml:
    """The three NVML calls the sampler needs, through ctypes."""

    class Memory(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    def __init__(self):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise OSError("nvmlInit_v2 failed")

    def handle(self, index, pci_bus_id=None):
        h = ctypes.c_void_p()
        if pci_bus_id:
            fn = getattr(self.lib, "nvmlDeviceGetHandleByPciBusId_v2", None)
            if fn is not None and fn(pci_bus_id.encode(), ctypes.byref(h)) == 0:
                return h
        if self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(h)) != 0:
            raise OSError(f"nvmlDeviceGetHandleByIndex_v2({index}) failed")
        return h

    def used(self, h):
        m = self.Memory()
        if self.lib.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m)) != 0:
            raise OSError("nvmlDeviceGetMemoryInfo failed")
        return m.used


def _nvml_index(device):
    """NVML's index of CUDA device `device` before CUDA is initialized: the
    device'th entry of CUDA_VISIBLE_DEVICES when that lists indices (NVML and
    CUDA agree on PCI order with one GPU or CUDA_DEVICE_ORDER=PCI_BUS_ID;
    refine_device() corrects it by PCI bus id once CUDA is up)."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if device < len(visible) and visible[device].isdigit():
        return int(visible[device])
    return device


def _pci_bus_id(device):
    """The device's PCI bus id as NVML writes it, if torch can tell (CUDA ordinals
    and NVML indices differ under CUDA_VISIBLE_DEVICES)."""
    try:
        import torch

        p = torch.cuda.get_device_properties(device)
        dom, bus, dev = getattr(p, "pci_domain_id", None), getattr(p, "pci_bus_id", None), getattr(p, "pci_device_id", None)
        if bus is None:
            return None
        return f"{dom or 0:08x}:{bus:02x}:{dev or 0:02x}.0"
    except Exception:
        return None


class PeakSampler:
    """Samples device memory used (bytes) in a background thread; peak() is the
    maximum since the last reset().  Start it before CUDA is used to get the
    baseline (memory used before this process touched the device)."""

    def __init__(self, device=0, interval=0.002):
        self.device = device
        self.interval = interval
        self.source = None
        self.baseline = None
        self._peak = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self._proc = None
        self.note = ""
        try:
            self._nvml = _Nvml()
            self._handle = self._nvml.handle(_nvml_index(device))
            self.baseline = self._nvml.used(self._handle)
            self.source = "nvml"
        except Exception as e:  # no NVML: nvidia-smi, else mem_get_info
            self._nvml = None
            self.note = f"NVML unavailable ({e})"
            if shutil.which("nvidia-smi"):
                self.source = "nvidia-smi"
            else:
                self.source = "mem_get_info"

    def refine_device(self):
        """Once CUDA is initialized: re-pick the NVML device by PCI bus id."""
        if self._nvml is None:
            return
        bus = _pci_bus_id(self.device)
        if bus:
            try:
                self._handle = self._nvml.handle(self.device, bus)
            except Exception:
                pass

    def _record(self, used):
        with self._lock:
            if used > self._peak:
                self._peak = used

    def _run_nvml(self):
        while not self._stop.is_set():
            try:
                self._record(self._nvml.used(self._handle))
            except Exception:
                pass
            time.sleep(self.interval)

    def _run_smi(self):
        cmd = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
               "-i", str(self.device), "-lms", "20"]
        try:
            self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError as e:
            self.note += f"; nvidia-smi failed ({e})"
            self.source = "mem_get_info"
            return
        for line in self._proc.stdout:
            if self._stop.is_set():
                break
            try:
                self._record(int(line.strip()) * 1024 * 1024)
            except ValueError:
                pass

    def start(self):
        target = {"nvml": self._run_nvml, "nvidia-smi": self._run_smi}.get(self.source)
        if target:
            self._thread = threading.Thread(target=target, daemon=True)
            self._thread.start()
        return self

    def poll(self):
        """Called at each step end: the fallback source, and a sample for the others."""
        if self.source == "mem_get_info":
            import torch

            free, total = torch.cuda.mem_get_info(self.device)
            self._record(total - free)
        elif self.source == "nvml":
            try:
                self._record(self._nvml.used(self._handle))
            except Exception:
                pass

    def reset(self):
        with self._lock:
            self._peak = 0
        self.poll()

    def peak(self):
        self.poll()
        with self._lock:
            return self._peak

    def stop(self):
        self._stop.set()
        if self._proc is not None:
            self._proc.terminate()
        if self._thread is not None:
            self._thread.join(timeout=1)


# --- cachalloc's own counters ------------------------------------------------------------

FREE_ENTRIES = ("cuMemFree_v2", "cuMemFreeAsync", "cuMemFreeAsync_ptsz", "cudaFree", "cudaFreeAsync")
# Device-stats keys that count driver calls made on the program's behalf:
# segments allocated and freed, device-wide synchronizations, and the events
# recorded for fences (num_fence_events) and the stream queries that let a
# fence skip idle streams (num_fence_stream_queries), fence joins and
# cross-stream reuses (an event record and a stream wait each, counted once
# as joins are).  Any other key naming events (a future num_event_queries,
# say) is added too; num_fences is not (a fence is counted by the calls it
# took).  See driver_calls().
DRIVER_CALL_KEYS = ("num_device_alloc", "num_device_free", "num_sync_all_streams", "num_fence_events",
                    "num_fence_stream_queries", "num_fence_joins", "num_cross_stream_reuses")


def _is_driver_call_key(k):
    kl = k.lower()
    if k in DRIVER_CALL_KEYS:
        return True
    return "event" in kl and kl.startswith("num_")


def driver_calls(dump):
    """(driver calls, which counters were summed, frees) of one stats dump
    (schema of docs/OBSERVABILITY.md).  Uses interposer.driver_calls when
    cachalloc writes one (an int or a dict of counts), else sums the
    device-stats counters that name driver work."""
    inter = dump.get("interposer", {}) or {}
    calls = inter.get("calls", {}) or {}
    frees = sum(int(calls.get(k, 0)) for k in FREE_ENTRIES)
    used, total = [], 0
    for dev in dump.get("devices", []) or []:
        for k, v in (dev.get("stats", {}) or {}).items():
            if _is_driver_call_key(k) and isinstance(v, (int, float)):
                total += int(v)
                if k not in used:
                    used.append(k)
    # interposer.driver_calls counts only the calls made inside timed
    # wrappers (0 when timing is off): the larger count is the truer one.
    dc = inter.get("driver_calls")
    if isinstance(dc, dict):
        dc = sum(int(v) for v in dc.values() if isinstance(v, (int, float)))
    if isinstance(dc, (int, float)) and int(dc) > total:
        return int(dc), ["interposer.driver_calls"], frees
    return total, used, frees


def fence_stats(dump):
    """The fence figures of a dump, summed over devices (absent keys left out):
    frees that waited for a fence, fences, their events, and the bytes held back
    by pending fences (current and peak), release_before_peak's releases
    and release_remap's remaps (grows and bytes moved), and cross-stream
    reuses."""
    out = {}
    for dev in dump.get("devices", []) or []:
        st = dev.get("stats", {}) or {}
        for k in ("num_deferred_frees", "num_fences", "num_fence_events", "num_fence_joins", "num_fence_waits",
                  "num_peak_releases", "num_peak_remaps", "peak_remap_bytes", "deferred_free_bytes.peak",
                  "deferred_free_bytes.current", "num_cross_stream_reuses"):
            if k in st:
                out[k] = out.get(k, 0) + int(st[k])
    return out


def summarize_dump(dump):
    inter = dump.get("interposer", {}) or {}
    calls = sum(int(v) for v in (inter.get("calls", {}) or {}).values())
    dcalls, used, frees = driver_calls(dump)
    peak_reserved = sum(int((d.get("stats", {}) or {}).get("reserved_bytes.all.peak", 0))
                        for d in dump.get("devices", []) or [])
    return {"calls": calls, "ns_inside": int(inter.get("ns_inside", 0)),
            "ns_in_driver": int(inter.get("ns_in_driver", 0)), "frees": frees,
            "driver_calls": dcalls, "driver_call_counters": used, "reserved_peak": peak_reserved,
            "fences": fence_stats(dump),
            # which driver functions (dumps that split interposer.driver_calls)
            "driver_calls_by": {k: int(v) for k, v in (inter.get("driver_calls_by") or {}).items()}}


def per_call(s):
    """Adds ns_per_call (time inside cachalloc per call) and ns_own_per_call
    (the same less the driver calls it made: new segments, events, syncs)."""
    calls = s.get("calls") or 0
    s["ns_per_call"] = s["ns_inside"] / calls if calls else None
    s["ns_own_per_call"] = (s["ns_inside"] - s.get("ns_in_driver", 0)) / calls if calls else None
    return s


def diff_summary(a, b):
    """b - a for the counters (a phase's own figures)."""
    out = {k: b[k] - a[k] for k in ("calls", "ns_inside", "ns_in_driver", "frees", "driver_calls")}
    out["driver_call_counters"] = b["driver_call_counters"]
    per_call(out)
    out["driver_calls_per_free"] = out["driver_calls"] / out["frees"] if out["frees"] else None
    out["reserved_peak"] = b["reserved_peak"]
    fa, fb = a.get("fences", {}), b.get("fences", {})
    # (counters as differences; the gauges, deferred_free_bytes.peak and
    # .current, as they stand at the end)
    out["fences"] = {k: (v - fa.get(k, 0) if k.startswith("num_") or k.endswith("_bytes") else v)
                     for k, v in fb.items()}
    ba, bb = a.get("driver_calls_by") or {}, b.get("driver_calls_by") or {}
    out["driver_calls_by"] = {k: v - ba.get(k, 0) for k, v in bb.items() if v - ba.get(k, 0)}
    return out


class CachallocCounters:
    """cachalloc_stats_json through ctypes; .available is False without cachalloc."""

    key = "cachalloc"

    def __init__(self):
        self.available = False
        try:
            # Pluggable: the library PyTorch loaded (the same handle), else the preloaded one.
            self.lib = ctypes.CDLL(os.environ.get("BENCH_CACHALLOC_PLUGGABLE") or None)
            self.fn = self.lib.cachalloc_stats_json
            self.size_fn = self.lib.cachalloc_stats_json_size
            self.fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
            self.size_fn.argtypes = [ctypes.POINTER(ctypes.c_size_t)]
            self.available = True
        except (OSError, AttributeError):
            pass

    def dump(self):
        if not self.available:
            return None
        for _ in range(4):
            need = ctypes.c_size_t(0)
            self.size_fn(ctypes.byref(need))
            buf = ctypes.create_string_buffer(need.value + 65536)
            rc = self.fn(buf, len(buf))
            if rc == 0:
                try:
                    return json.loads(buf.value.decode())
                except ValueError:
                    return None
            if rc != 1:  # not initialized yet, or another error
                return None
        return None

    def snapshot(self):
        d = self.dump()
        return summarize_dump(d) if d is not None else None

    @staticmethod
    def diff(a, b):
        return diff_summary(a, b)


# --- timing and output ---------------------------------------------------------------------

def thread_sched():
    """(ns on a CPU, ns waiting on a run queue, CPU number) of the calling
    thread, from /proc (Linux); Nones elsewhere."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            run_ns, wait_ns = (int(x) for x in f.read().split()[:2])
        with open("/proc/thread-self/stat") as f:
            cpu = int(f.read().rsplit(")", 1)[1].split()[36])  # field 39, 'processor'
        return run_ns, wait_ns, cpu
    except (OSError, ValueError, IndexError):
        return None, None, None


class StepTimer:
    """Host ms per step (each step starts and ends with a device synchronize).

    Beside the wall time it keeps, per step, what explains a slow process
    without a profiler: the main thread's time on a CPU (`cpu_ms`; the rest
    of the step it is blocked, mostly in synchronizes while the GPU works),
    its time waiting for a CPU (`wait_ms`, the kernel's run-queue delay), and
    the CPU it ended the step on (`cpus`).  The same work taking more CPU
    time in one process than in another means a slower CPU for that process
    (docs/BENCHMARKS.md section 5: pinning measured)."""

    def __init__(self):
        import torch

        self.torch = torch
        self.reset()

    def reset(self):
        self.times, self.cpu_ms, self.wait_ms, self.cpus = [], [], [], []

    def __enter__(self):
        self.torch.cuda.synchronize()
        self.s0 = thread_sched()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.torch.cuda.synchronize()
        self.times.append((time.perf_counter() - self.t0) * 1e3)
        run_ns, wait_ns, cpu = thread_sched()
        if run_ns is not None and self.s0[0] is not None:
            self.cpu_ms.append((run_ns - self.s0[0]) / 1e6)
            self.wait_ms.append((wait_ns - self.s0[1]) / 1e6)
            self.cpus.append(cpu)
        return False

    def host(self):
        """The RESULT keys beside step_ms (empty lists without /proc)."""
        return {"step_cpu_ms": self.cpu_ms, "step_wait_ms": self.wait_ms, "step_cpus": self.cpus,
                "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None}


def emit(result):
    name = result["program"]
    for i, (v, h) in enumerate(zip(result.get("loss_values", []), result.get("losses", []))):
        print(f"LOSS program={name} step={i} value={v!r} hex={h}")
    ms = result.get("step_ms", [])
    if ms:
        print(f"STEP_MS program={name} median={statistics.median(ms):.3f} min={min(ms):.3f} "
              f"max={max(ms):.3f} n={len(ms)}")
    peak = result.get("peak") or {}
    if peak.get("bytes") is not None:
        print(f"PEAK program={name} bytes={peak['bytes']} source={peak.get('source')}")
    print("RESULT " + json.dumps(result, sort_keys=True), flush=True)
    sys.stdout.flush()


def skip(name, why):
    emit({"program": name, "ok": False, "skipped": True, "error": why})


def use_pluggable_if_asked():
    """BENCH_CACHALLOC_PLUGGABLE=path (run_bench.py's cachalloc_pluggable):
    cachalloc becomes PyTorch's pluggable allocator, before any CUDA
    allocation; its Python package from BENCH_CACHALLOC_MODULE."""
    pluggable = os.environ.get("BENCH_CACHALLOC_PLUGGABLE")
    if pluggable:
        sys.path.insert(0, os.environ.get("BENCH_CACHALLOC_MODULE", ""))
        import cachalloc

        cachalloc.use_with_torch(pluggable)


def import_torch(name):
    """torch, or None after printing `NAME: SKIP (...)` (torch missing or no GPU)."""
    try:
        import torch
    except ImportError as e:
        print(f"{name}: SKIP (torch not importable: {e})")
        return None
    use_pluggable_if_asked()
    if not torch.cuda.is_available():
        print(f"{name}: SKIP (no CUDA device)")
        return None
    return torch


class CallTimerCounters:
    """bench/call_timer.so's totals (preloaded into the cudapool contender):
    the driver's allocation calls and the host time inside them, the figures
    cachalloc's counters give for it.  .available is False without it."""

    key = "call_timer"

    def __init__(self):
        self.available = False
        try:
            self.fn = ctypes.CDLL(None).call_timer_read
            self.fn.argtypes = [ctypes.POINTER(ctypes.c_ulonglong)]
            self.available = True
        except (OSError, AttributeError):
            pass

    def snapshot(self):
        out = (ctypes.c_ulonglong * 3)()
        self.fn(out)
        return {"calls": out[0], "ns_inside": out[1], "frees": out[2]}

    @staticmethod
    def diff(a, b):
        out = {k: b[k] - a[k] for k in ("calls", "ns_inside", "frees")}
        out["ns_per_call"] = out["ns_inside"] / out["calls"] if out["calls"] else None
        return out


def allocator_counters():
    """cachalloc's counters where it is loaded, else the call timer's, else
    an object whose .available is False."""
    counters = CachallocCounters()
    return counters if counters.available else CallTimerCounters()


def start_measuring(torch, device):
    """The NVML peak sampler (started) and the allocator's counters
    (allocator_counters()), with CUDA initialized so that the sampler knows
    the device's NVML index."""
    sampler = PeakSampler(device).start()
    counters = allocator_counters()
    torch.cuda.init()
    sampler.refine_device()
    return sampler, counters


def measure_one(torch, device, run):
    """A one-phase program: run(sampler, counters or None) under the peak
    sampler, its result emitted with the peak; the exit status."""
    sampler, counters = start_measuring(torch, device)
    sampler.reset()
    result = run(sampler, counters if counters.available else None)
    result["peak"] = {"bytes": sampler.peak(), "baseline_bytes": sampler.baseline, "source": sampler.source}
    sampler.stop()
    emit(result)
    return 0 if result["ok"] else 1
