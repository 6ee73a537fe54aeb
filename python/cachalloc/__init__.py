"""cachalloc — talk to libcachalloc.so from Python (standard library only).

Two uses, both through ctypes (include/cachalloc.h is the reference):

* Statistics and control of the cache that serves the process, whichever way
  cachalloc was brought in (LD_PRELOAD / the ``cachalloc`` launcher, or
  PyTorch's pluggable allocator)::

      import cachalloc
      cachalloc.stats()            # the stats dump (dict), as CACHALLOC_CONF=stats:PATH writes it
      cachalloc.stats(0)           # device 0's statistics, keyed like torch.cuda.memory_stats()
      print(cachalloc.memory_summary())   # torch.cuda.memory_summary()'s table
      cachalloc.empty_cache()      # every device (or empty_cache(device))

* PyTorch's allocator, without LD_PRELOAD::

      import cachalloc, torch
      cachalloc.use_with_torch()   # before the first CUDA allocation
      ...
      pool = cachalloc.mem_pool()  # or only for a region: torch.cuda.MemPool
      with torch.cuda.use_mem_pool(pool):
          ...

Which library: the libcachalloc.so the process has already loaded
(preloaded, or loaded by PyTorch); else ``CACHALLOC_LIBRARY``; else the one
this package was installed with (``pip install .``: the one inside the
package; meson install: the prefix's); else
``ctypes.util.find_library("cachalloc")``.

Until cachalloc has served an allocation the statistics are empty (``{}``),
``memory_summary()`` says so and ``empty_cache()`` does nothing, as
torch.cuda's functions do before CUDA is initialized.  Other failures raise
``CachallocError`` (its ``code`` is the CUresult-numbered code of
cachalloc.h).
"""

import contextlib
import ctypes
import ctypes.util
import json
import os
import threading

__all__ = [
    "__version__",
    "CachallocError",
    "library_path",
    "load",
    "is_loaded",
    "library_version",
    "stats",
    "memory_summary",
    "empty_cache",
    "reset_peak_memory_stats",
    "reset_accumulated_memory_stats",
    "snapshot",
    "record_stream",
    "validate",
    "set_per_process_memory_fraction",
    "get_per_process_memory_fraction",
    "pluggable_allocator",
    "use_with_torch",
    "patch_torch",
    "unpatch_torch",
    "mem_pool",
    "use_mem_pool",
]

# Substituted by meson (python/cachalloc/meson.build): the library this copy
# belongs to (a bare name: beside this file, as in the wheel), and meson's
# project version (cachalloc --version and cachalloc_version() say the same).
_CONFIGURED_LIBRARY = "@CACHALLOC_LIB@"
if not _CONFIGURED_LIBRARY.startswith("@") and not os.path.isabs(_CONFIGURED_LIBRARY):
    _CONFIGURED_LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), _CONFIGURED_LIBRARY)
__version__ = "@CACHALLOC_VERSION@"
if __version__.startswith("@"):  # the unconfigured source file
    __version__ = None

SUCCESS = 0
ERROR_INVALID_VALUE = 1
ERROR_OUT_OF_MEMORY = 2
ERROR_NOT_INITIALIZED = 3
ERROR_DEINITIALIZED = 4
ERROR_INVALID_DEVICE = 101
ERROR_OPERATING_SYSTEM = 304
ERROR_ILLEGAL_STATE = 401
ERROR_STREAM_CAPTURE_UNSUPPORTED = 900
ERROR_UNKNOWN = 999

_MESSAGES = {
    ERROR_INVALID_VALUE: "invalid value",
    ERROR_OUT_OF_MEMORY: "out of host memory",
    ERROR_NOT_INITIALIZED: "cachalloc is not active (nothing served yet, disabled, or a fork child)",
    ERROR_DEINITIALIZED: "the process is exiting",
    ERROR_INVALID_DEVICE: "no cachalloc cache for that device",
    ERROR_OPERATING_SYSTEM: "a file could not be written or read (a pause's backup file: cachalloc's log says why)",
    ERROR_ILLEGAL_STATE: "an allocator invariant is violated",
    ERROR_STREAM_CAPTURE_UNSUPPORTED: "not allowed while a CUDA graph capture is in flight",
    ERROR_UNKNOWN: "internal error",
}


class CachallocError(RuntimeError):
    """A control function of libcachalloc.so failed; ``code`` says why."""

    def __init__(self, function, code, detail="", reason=None):
        # reason: the true cause, said first, where the code's general
        # meaning would mislead (a library that cannot be found is not a
        # library that is "not active")
        self.function = function
        self.code = code
        if reason is not None:
            super().__init__(f"{function}: {reason} (code {code})" + (f": {detail}" if detail else ""))
            return
        text = f"{function}: {_MESSAGES.get(code, 'error')} (code {code})"
        super().__init__(text + (f": {detail}" if detail else ""))


_lock = threading.Lock()
_lib = None
_lib_path = None
_torch_allocators = {}  # path -> torch CUDAPluggableAllocator (one per library: torch keeps it alive)
_torch_swapped = False  # use_with_torch() made cachalloc PyTorch's allocator (every tensor reaches it)


def _mapped_path(prefix):
    """The path of a library this process has mapped whose file name starts
    with `prefix` (and that still exists), or None."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(None, 5)  # address perms offset dev inode [path]
                path = fields[5].strip() if len(fields) == 6 else ""
                if os.path.basename(path).startswith(prefix) and os.path.isfile(path):
                    return path
    except OSError:
        pass
    return None


def _loaded_library_path():
    """The path of a libcachalloc.so this process has mapped, or None."""
    return _mapped_path("libcachalloc.so")


def library_path():
    """The libcachalloc.so this module uses (see the module's docstring)."""
    loaded = _loaded_library_path()  # the one serving this process, whatever else is named
    if loaded:
        return loaded
    explicit = os.environ.get("CACHALLOC_LIBRARY")
    if explicit:
        return explicit
    if not _CONFIGURED_LIBRARY.startswith("@") and os.path.isfile(_CONFIGURED_LIBRARY):
        return _CONFIGURED_LIBRARY
    found = ctypes.util.find_library("cachalloc")
    if found:
        return found
    raise CachallocError("library_path", ERROR_NOT_INITIALIZED,
                         reason="libcachalloc.so not found: not loaded in this process, CACHALLOC_LIBRARY unset, "
                                "and none beside this package or on the linker's path; set CACHALLOC_LIBRARY to "
                                "its path, or run the program under the cachalloc launcher")


def _declare(lib):
    c_int, c_size_t, c_void_p, c_char_p = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p
    protos = {
        "cachalloc_version": (c_char_p, []),
        "cachalloc_empty_cache": (c_int, [c_int]),
        "cachalloc_stats_json": (c_int, [c_char_p, c_size_t]),
        "cachalloc_stats_json_size": (c_int, [ctypes.POINTER(c_size_t)]),
        "cachalloc_reset_peak_stats": (c_int, [c_int]),
        "cachalloc_reset_accumulated_stats": (c_int, [c_int]),
        "cachalloc_snapshot": (c_int, [c_char_p]),
        "cachalloc_record_stream": (c_int, [c_void_p, c_void_p]),
        "cachalloc_validate": (c_int, [c_char_p, c_size_t]),
        "cachalloc_summary": (c_int, [c_int, c_char_p, c_size_t]),
        "cachalloc_set_memory_fraction": (c_int, [ctypes.c_double, c_int]),
        "cachalloc_get_memory_fraction": (c_int, [c_int, ctypes.POINTER(ctypes.c_double)]),
        "cachalloc_get_base_allocation": (c_int, [c_void_p, ctypes.POINTER(c_void_p), ctypes.POINTER(c_size_t)]),
        "cachalloc_malloc": (c_void_p, [ctypes.c_ssize_t, c_int, c_void_p]),
        "cachalloc_free": (None, [c_void_p, ctypes.c_ssize_t, c_int, c_void_p]),
    }
    for name, (restype, argtypes) in protos.items():
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype = restype
            fn.argtypes = argtypes
    return lib


def load(path=None):
    """The library, loaded once (ctypes.CDLL, as PyTorch loads it).

    A library preloaded into the process is used as it is; otherwise the one
    at ``path`` (default: library_path()).  Loading it this way turns on no
    interception of the process's allocations (include/cachalloc.h)."""
    global _lib, _lib_path
    with _lock:
        if _lib is not None and (path is None or os.path.realpath(path) == os.path.realpath(_lib_path)):
            return _lib
        if path is None:
            path = library_path()
        _lib = _declare(ctypes.CDLL(path))
        _lib_path = path
        return _lib


def is_loaded():
    """Whether a libcachalloc.so is mapped in this process (nothing is loaded to find out)."""
    return _lib is not None or _loaded_library_path() is not None


def library_version():
    """The version the library says it is (cachalloc_version()); __version__
    is this module's.  None for a library older than the function."""
    fn = getattr(load(), "cachalloc_version", None)
    return fn().decode() if fn is not None else None


def _check(function, code, allow=()):
    if code == SUCCESS or code in allow:
        return code
    raise CachallocError(function, code)


def _text(function, call):
    """Text from a buffer-filling function (cachalloc_stats_json's protocol);
    None when cachalloc is not active."""
    size = 1 << 16
    for _ in range(8):
        buf = ctypes.create_string_buffer(size)
        code = call(buf, size)
        if code == SUCCESS:
            return buf.value.decode("utf-8", "replace")
        if code == ERROR_NOT_INITIALIZED:
            return None
        if code != ERROR_INVALID_VALUE or not buf.value.isdigit():
            raise CachallocError(function, code)
        size = int(buf.value) + 4096  # the text grows while the process runs
    raise CachallocError(function, ERROR_INVALID_VALUE, "statistics kept growing")


def _device_index(device):
    if device is None:
        return -1
    if isinstance(device, str):  # "cuda:1"; "cuda" means every device
        return int(device.rsplit(":", 1)[1]) if ":" in device else -1
    if isinstance(device, int):
        return device
    index = getattr(device, "index", None)  # torch.device
    return -1 if index is None else int(index)


def stats(device=None):
    """The statistics.

    device None: the whole dump (``{"version":1, "pid":..., "interposer":...,
    "devices":[{"device":0, "stats":{...}, ...}, ...]}``).  A device (int,
    "cuda:N", torch.device): that device's statistics, flat and keyed like
    torch.cuda.memory_stats() (summed over its live contexts).  ``{}`` while
    cachalloc has served nothing."""
    lib = load()
    text = _text("cachalloc_stats_json", lib.cachalloc_stats_json)
    if text is None:
        return {}
    dump = json.loads(text)
    if device is None:
        return dump
    index = _device_index(device)
    result = {}
    for entry in dump.get("devices", []):
        if entry.get("device") != index or entry.get("context_destroyed"):
            continue
        for key, value in entry.get("stats", {}).items():
            if key not in result:
                result[key] = value
            elif key.endswith(".peak") or key == "max_split_size":
                result[key] = max(result[key], value)  # several contexts on one device: an upper bound
            else:
                result[key] += value
    return result


def memory_summary(device=None):
    """torch.cuda.memory_summary()'s table: for one device, or (None) every
    device plus cachalloc's interposer section."""
    lib = load()
    index = _device_index(device)
    text = _text("cachalloc_summary", lambda buf, size: lib.cachalloc_summary(index, buf, size))
    if text is None:
        return "cachalloc: no allocation served yet in this process\n"
    return text


def empty_cache(device=None):
    """Returns every unused cached block of the device (None: all) to the driver."""
    # Nothing served yet, or nothing cached for that device: nothing to return.
    _check("cachalloc_empty_cache", load().cachalloc_empty_cache(_device_index(device)),
           allow=(ERROR_NOT_INITIALIZED, ERROR_INVALID_DEVICE))


def reset_peak_memory_stats(device=None):
    """Peaks back to the current values (None: every device)."""
    _check("cachalloc_reset_peak_stats", load().cachalloc_reset_peak_stats(_device_index(device)),
           allow=(ERROR_NOT_INITIALIZED,))


def reset_accumulated_memory_stats(device=None):
    """Accumulated counts ("allocated", "freed", event counters) back to zero."""
    _check("cachalloc_reset_accumulated_stats",
           load().cachalloc_reset_accumulated_stats(_device_index(device)), allow=(ERROR_NOT_INITIALIZED,))


def snapshot(path=None):
    """Writes every segment and block now to `path` (placeholders %p %h %r %d;
    None: the configured snapshot path).  Returns True, or False while
    cachalloc has served nothing."""
    code = load().cachalloc_snapshot(None if path is None else os.fsencode(path))
    return _check("cachalloc_snapshot", code, allow=(ERROR_NOT_INITIALIZED,)) == SUCCESS


def _stream_handle(stream):
    if stream is None:
        return None
    handle = getattr(stream, "cuda_stream", stream)  # torch.cuda.Stream
    return int(handle) or None


def record_stream(ptr, stream):
    """Marks the live block at `ptr` as used on `stream` (int handle or
    torch.cuda.Stream): its memory is reused only after that stream's work."""
    if hasattr(ptr, "untyped_storage"):  # a tensor: its allocation's start, not a view's
        ptr = ptr.untyped_storage().data_ptr()
    _check("cachalloc_record_stream", load().cachalloc_record_stream(ptr, _stream_handle(stream)))


def validate():
    """Checks every allocator invariant; raises CachallocError naming the first violation."""
    buf = ctypes.create_string_buffer(1024)
    code = load().cachalloc_validate(buf, len(buf))
    if code == ERROR_ILLEGAL_STATE:
        raise CachallocError("cachalloc_validate", code, buf.value.decode("utf-8", "replace"))
    _check("cachalloc_validate", code, allow=(ERROR_NOT_INITIALIZED,))


def set_per_process_memory_fraction(fraction, device=None):
    """Caps what the pluggable allocator keeps reserved on the device (None:
    every device) at fraction * its memory (include/cachalloc.h)."""
    _check("cachalloc_set_memory_fraction", load().cachalloc_set_memory_fraction(float(fraction), _device_index(device)))


def get_per_process_memory_fraction(device=0):
    value = ctypes.c_double(0.0)
    _check("cachalloc_get_memory_fraction",
           load().cachalloc_get_memory_fraction(max(_device_index(device), 0), ctypes.byref(value)))
    return value.value


# --- PyTorch ------------------------------------------------------------------------

# The hooks of include/cachalloc.h, by the setter of torch._C._CUDAPluggableAllocator
# that takes them.  set_init_fn is not wired: PyTorch calls init when it creates
# the allocator, before any setter can run.
_TORCH_HOOKS = {
    "set_reset_fn": "cachalloc_pluggable_empty_cache",
    "set_memory_fraction_fn": "cachalloc_pluggable_set_memory_fraction",
    "set_base_alloc_fn": "cachalloc_pluggable_base_alloc",
    "set_record_stream_fn": "cachalloc_pluggable_record_stream",
    # CUDA graph pools (PyTorch 2.3+): torch.cuda.graph with default settings
    "set_begin_allocate_to_pool": "cachalloc_pluggable_begin_allocate_to_pool",
    "set_end_allocate_to_pool_fn": "cachalloc_pluggable_end_allocate_to_pool",
    "set_release_pool": "cachalloc_pluggable_release_pool",
}


def pluggable_allocator(path=None, hooks=True, oom_error=True):
    """A torch.cuda.memory.CUDAPluggableAllocator over cachalloc_malloc /
    cachalloc_free, with cachalloc's hooks wired where this PyTorch offers
    setters for them (record_stream, empty_cache, memory fraction, base
    allocation, CUDA graph pools).  With oom_error (the default), through
    the small companion built against this PyTorch
    (cachalloc/torch_companion.py) so that out of memory raises
    torch.OutOfMemoryError; where it cannot be built (no C++ compiler or
    headers) a warning says so and out of memory hands PyTorch a NULL.
    One per library, reused.  Does not make it current."""
    import torch

    if path is None:
        path = library_path()
    key = os.path.realpath(path)
    with _lock:
        if key in _torch_allocators:
            return _torch_allocators[key]
    lib = load(path)
    companion = None
    if oom_error:
        from . import torch_companion

        companion = torch_companion.companion_path(_loaded_library_path() or path)
    if companion is not None:
        allocator = torch.cuda.memory.CUDAPluggableAllocator(companion, "cachalloc_torch_malloc",
                                                            "cachalloc_torch_free")
    else:
        allocator = torch.cuda.memory.CUDAPluggableAllocator(path, "cachalloc_malloc", "cachalloc_free")
    if hooks:
        native = allocator.allocator()
        for setter, symbol in _TORCH_HOOKS.items():
            set_fn = getattr(native, setter, None)
            fn = getattr(lib, symbol, None)
            if callable(set_fn) and fn is not None:
                set_fn(ctypes.cast(fn, ctypes.c_void_p).value)
    with _lock:
        return _torch_allocators.setdefault(key, allocator)


def use_with_torch(path=None, hooks=True, patch=True, oom_error=True):
    """Makes cachalloc PyTorch's CUDA allocator (change_current_allocator).

    Call it before the first CUDA allocation of the process (PyTorch refuses
    to swap an allocator in use).  PyTorch's pluggable interface does not
    forward torch.cuda.memory_stats() and the functions built on it, so
    (patch=True) patch_torch() makes them answer with cachalloc's numbers.
    Returns the allocator."""
    import torch

    global _torch_swapped
    allocator = pluggable_allocator(path, hooks, oom_error)
    torch.cuda.memory.change_current_allocator(allocator)
    _torch_swapped = True
    if patch:
        patch_torch()
    return allocator


def patch_torch():
    """torch.cuda.memory_stats(), memory_allocated(), max_memory_allocated(),
    memory_reserved(), max_memory_reserved(), reset_peak_memory_stats(),
    reset_accumulated_memory_stats(), memory_summary(), memory_snapshot()
    and torch.cuda.memory._snapshot() answer with cachalloc's statistics of
    the device (cachalloc/torch_memory.py).  use_with_torch() calls it; call
    it yourself under LD_PRELOAD with PyTorch's caching off
    (PYTORCH_NO_CUDA_MEMORY_CACHING=1), where PyTorch's answer zeros.
    Returns the names replaced."""
    from cachalloc import torch_memory

    return torch_memory.patch()


def unpatch_torch():
    """Gives PyTorch its own memory functions back."""
    from cachalloc import torch_memory

    torch_memory.unpatch()


def mem_pool(path=None, **kwargs):
    """A torch.cuda.MemPool whose segments come from cachalloc (PyTorch's own
    allocator keeps managing the blocks inside them); kwargs go to MemPool
    (use_on_oom, no_split where this PyTorch has them)."""
    import torch

    return torch.cuda.MemPool(pluggable_allocator(path).allocator(), **kwargs)


@contextlib.contextmanager
def use_mem_pool(pool=None, device=None):
    """``with cachalloc.use_mem_pool(): ...`` — the allocations of this thread
    inside the block come from `pool` (default: a new mem_pool()).  Yields
    the pool; keep it alive as long as tensors allocated in it."""
    import torch

    if pool is None:
        pool = mem_pool()
    with torch.cuda.use_mem_pool(pool, device=device):
        yield pool


# Tags, pause and resume (docs/PAUSE.md); the torch_memory_saver drop-in is
# cachalloc.memory_saver.torch_memory_saver.
from .memory_saver import (region, pause, resume, set_tag, get_tag, tag_paused,  # noqa: E402
                           set_tag_backup, set_tag_retain_backup, get_tag_retain_backup, backup_pointer,
                           set_pause_backup_dir, empty_tag_cache, set_tag_in_pause_all, set_memory_margin)

__all__ += ["region", "pause", "resume", "set_tag", "get_tag", "tag_paused", "set_tag_backup",
            "set_tag_retain_backup", "get_tag_retain_backup", "backup_pointer", "set_pause_backup_dir",
            "empty_tag_cache", "set_tag_in_pause_all", "set_memory_margin"]
