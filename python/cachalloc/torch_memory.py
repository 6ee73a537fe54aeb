"""torch.cuda's memory functions answered with cachalloc's numbers.

Under PyTorch's pluggable allocator (``cachalloc.use_with_torch()``)
``torch.cuda.memory_stats()`` and everything built on it raise
"CUDAPluggableAllocator does not yet support getDeviceStats" (PyTorch's own
limitation); under LD_PRELOAD with PyTorch's caching off
(PYTORCH_NO_CUDA_MEMORY_CACHING=1) they answer zeros.  Training scripts and
libraries call them (peak-memory prints, Lightning's DeviceStatsMonitor,
Hugging Face's memory metrics, vLLM's profiling).  ``patch()`` replaces them,
in ``torch.cuda`` and ``torch.cuda.memory``, by functions that read
cachalloc's statistics (keyed exactly as PyTorch keys them) through the
control API:

    memory_stats, memory_allocated, max_memory_allocated, memory_reserved,
    max_memory_reserved, reset_peak_memory_stats,
    reset_accumulated_memory_stats, reset_max_memory_allocated,
    reset_max_memory_cached, memory_summary, memory_snapshot,
    torch.cuda.memory._snapshot

Each takes PyTorch's arguments and, like PyTorch's, means the current device
when given none.  Code that imported one of them by name before ``patch()``
(``from torch.cuda import memory_allocated``) keeps PyTorch's.
"""

import collections
import json
import os
import tempfile

import cachalloc

# The functions replaced, by name; torch.cuda re-exports torch.cuda.memory's,
# so both namespaces are patched (and the module's own helpers, such as
# memory_cached -> memory_reserved, find the replacements in its globals).
PATCHED = (
    "memory_stats",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "reset_peak_memory_stats",
    "reset_accumulated_memory_stats",
    "reset_max_memory_allocated",
    "reset_max_memory_cached",
    "memory_summary",
    "memory_snapshot",
    "_snapshot",
)

_originals = {}  # (namespace name, function name) -> PyTorch's function


def _torch():
    import torch

    return torch


def _device(device):
    """PyTorch's device argument as an index: None (or "cuda", or a
    torch.device without index) means the current device."""
    index = cachalloc._device_index(device)
    return _torch().cuda.current_device() if index == -1 else index


def memory_stats(device=None):
    """torch.cuda.memory_stats(): cachalloc's statistics of the device, under
    PyTorch's key names, sorted as PyTorch sorts them (an empty dict until
    cachalloc has served the device, as PyTorch before CUDA is initialized)."""
    stats = cachalloc.stats(_device(device))
    return collections.OrderedDict(sorted(stats.items()))


def memory_allocated(device=None):
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device=None):
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device=None):
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device=None):
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device=None):
    cachalloc.reset_peak_memory_stats(_device(device))


def reset_accumulated_memory_stats(device=None):
    cachalloc.reset_accumulated_memory_stats(_device(device))


def reset_max_memory_allocated(device=None):
    """Deprecated in PyTorch, where it resets every peak: so here."""
    reset_peak_memory_stats(device)


def reset_max_memory_cached(device=None):
    reset_peak_memory_stats(device)


def memory_summary(device=None, abbreviated=False):
    """torch.cuda.memory_summary()'s table, from cachalloc (the full table
    whatever `abbreviated` says)."""
    return cachalloc.memory_summary(_device(device))


def _snapshot(device=None):
    """torch.cuda.memory._snapshot(): cachalloc's segments and blocks now,
    in PyTorch's format (what ``cachalloc-report viz`` writes; every device,
    as PyTorch's; no trace: device_traces are empty)."""
    from cachalloc import report

    fd, path = tempfile.mkstemp(prefix="cachalloc-snapshot-", suffix=".json")
    os.close(fd)
    try:
        if not cachalloc.snapshot(path):
            return {"segments": [], "device_traces": [], "allocator_settings": {}, "external_annotations": []}
        with open(path) as f:
            snap = json.load(f)
    finally:
        os.unlink(path)
    config = cachalloc.stats().get("config", "")
    result, _notes = report.build_viz_snapshot(snap, None, config)
    return result


def memory_snapshot(mempool_id=None):
    """torch.cuda.memory_snapshot(): the segments of _snapshot()."""
    return _snapshot()["segments"]


def patch():
    """Replaces PyTorch's memory functions (PATCHED) by these; idempotent.
    Returns the names replaced."""
    torch = _torch()
    here = globals()
    done = []
    for space_name, space in (("torch.cuda", torch.cuda), ("torch.cuda.memory", torch.cuda.memory)):
        for name in PATCHED:
            if not hasattr(space, name):
                continue  # an older PyTorch without it
            current = getattr(space, name)
            if current is not here[name]:
                _originals.setdefault((space_name, name), current)
                setattr(space, name, here[name])
            done.append(f"{space_name}.{name}")
    return done


def unpatch():
    """Puts PyTorch's functions back."""
    torch = _torch()
    spaces = {"torch.cuda": torch.cuda, "torch.cuda.memory": torch.cuda.memory}
    for (space_name, name), fn in list(_originals.items()):
        setattr(spaces[space_name], name, fn)
        del _originals[(space_name, name)]
