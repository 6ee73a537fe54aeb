"""cachalloc.memory_saver — tags, pause and resume from Python (docs/PAUSE.md).

    import cachalloc
    with cachalloc.region("kv_cache"):            # allocations of this thread are tagged
        kv = torch.empty(...)
    with cachalloc.region("weights", cpu_backup=True):   # or cpu_backup="disk": a file
        model = Model().cuda()
    cachalloc.pause("kv_cache"); cachalloc.pause("weights")   # or pause() for every tag
    ...                                           # another engine uses the memory
    cachalloc.resume()                            # same addresses; weights restored

A drop-in for torch_memory_saver (TMS) users: change one import,

    from cachalloc.memory_saver import torch_memory_saver
    with torch_memory_saver.region(tag="weights", enable_cpu_backup=True): ...
    torch_memory_saver.pause("kv_cache"); torch_memory_saver.resume()

What differs from TMS is in docs/PAUSE.md ("For torch_memory_saver users").
cachalloc must serve the allocations: LD_PRELOAD=libcachalloc.so (the
``cachalloc`` launcher) with PYTORCH_NO_CUDA_MEMORY_CACHING=1, or
cachalloc.use_with_torch() (pluggable allocator).  Under LD_PRELOAD with
PyTorch's own cache on, region() puts the region's tensors in a private
torch.cuda.MemPool per tag, so that PyTorch's cache never hands one tag's
memory to another (TMS issue #85).
"""

import contextlib
import ctypes
import os
import threading
import warnings

from . import CachallocError, ERROR_INVALID_VALUE, SUCCESS, load

__all__ = ["region", "pause", "resume", "set_tag", "get_tag", "tag_paused", "set_tag_backup",
           "TorchMemorySaver", "torch_memory_saver"]

_protos_lock = threading.Lock()
_declared = False


def _lib():
    global _declared
    lib = load()
    with _protos_lock:
        if not _declared:
            for name, restype, argtypes in (
                    ("cachalloc_set_tag", ctypes.c_int, [ctypes.c_char_p]),
                    ("cachalloc_get_tag", ctypes.c_int, [ctypes.c_char_p, ctypes.c_size_t]),
                    ("cachalloc_set_tag_backup", ctypes.c_int, [ctypes.c_char_p, ctypes.c_int]),
                    ("cachalloc_pause", ctypes.c_int, [ctypes.c_char_p]),
                    ("cachalloc_resume", ctypes.c_int, [ctypes.c_char_p]),
                    ("cachalloc_tag_paused", ctypes.c_int, [ctypes.c_char_p])):
                fn = getattr(lib, name, None)
                if fn is None:
                    raise CachallocError(name, ERROR_INVALID_VALUE, "this libcachalloc.so predates tags")
                fn.restype, fn.argtypes = restype, argtypes
            _declared = True
    return lib


def _name(tag):
    return None if tag is None else str(tag).encode()


def _call(function, *args):
    code = getattr(_lib(), function)(*args)
    if code != SUCCESS:
        raise CachallocError(function, code)


def set_tag(tag):
    """Sets the calling thread's tag (None or "": untagged)."""
    _call("cachalloc_set_tag", _name(tag or ""))


def get_tag():
    """The calling thread's tag ("" when untagged)."""
    buf = ctypes.create_string_buffer(64)
    _call("cachalloc_get_tag", buf, 64)
    return buf.value.decode()


_BACKUP_MODES = {"none": 0, "host": 1, "cpu": 1, "disk": 2}


def _backup_mode(mode):
    """C's CACHALLOC_BACKUP_* for True/False/None or "none"/"host"/"disk"."""
    if isinstance(mode, str):
        try:
            return _BACKUP_MODES[mode.lower()]
        except KeyError:
            raise CachallocError("set_tag_backup", ERROR_INVALID_VALUE,
                                 "backup mode %r: expected True, False, 'host', 'disk' or 'none'" % (mode,)) from None
    return 1 if mode else 0


def set_tag_backup(tag, enable=True):
    """Where pause(tag) copies the tag's live memory: True or "host" (pinned
    host memory), "disk" (a nameless file in CACHALLOC_CONF's
    pause_backup_dir, default $TMPDIR or /tmp, through a small pinned
    staging buffer: for tags larger than the host memory to spare), False
    or "none" (no backup: contents are lost at pause)."""
    _call("cachalloc_set_tag_backup", _name(tag), _backup_mode(enable))


def pause(tag=None):
    """Gives the physical memory of `tag` (None: every tag) back to the device;
    the addresses stay reserved.  Raises CachallocError on failure (the tag
    is left consistent: docs/PAUSE.md)."""
    _call("cachalloc_pause", _name(tag))


def resume(tag=None):
    """Maps memory again at the paused addresses of `tag` (None: every tag)
    and restores its backup.  Out of memory raises and leaves it paused."""
    _call("cachalloc_resume", _name(tag))


def tag_paused(tag):
    code = _lib().cachalloc_tag_paused(_name(tag))
    if code < 0:
        raise CachallocError("cachalloc_tag_paused", -code)
    return code == 1


_pools = {}  # tag -> torch.cuda.MemPool (kept alive: its segments belong to the tag)


def _torch_pool(tag):
    """A private torch.cuda.MemPool for `tag` when PyTorch's own caching
    allocator serves tensors (it would otherwise mix tags in its cache), else None."""
    import sys
    from . import _torch_allocators
    torch = sys.modules.get("torch")
    if torch is None or os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1" or _torch_allocators:
        return None  # every tensor reaches cachalloc (no PyTorch cache), or the pluggable allocator
    try:
        backend = torch.cuda.memory.get_allocator_backend() if hasattr(torch.cuda.memory, "get_allocator_backend") \
            else torch.cuda.get_allocator_backend()
    except Exception:  # noqa: BLE001 - an old torch: assume its own allocator
        backend = "native"
    if backend != "native" or not hasattr(torch.cuda, "MemPool"):
        return None  # the pluggable allocator: every tensor reaches cachalloc
    pool = _pools.get(tag)
    if pool is None:
        pool = _pools[tag] = torch.cuda.MemPool()
    return pool


@contextlib.contextmanager
def region(tag, cpu_backup=False):
    """Allocations of this thread inside the block belong to `tag`.
    cpu_backup: True (or "host") backs the tag up in pinned host memory at
    its pauses, "disk" in a file (set_tag_backup); False leaves the tag's
    backup as it was set before."""
    if not tag:
        raise CachallocError("region", ERROR_INVALID_VALUE, "a region needs a tag name")
    if cpu_backup:
        set_tag_backup(tag, cpu_backup)
    previous = get_tag()
    set_tag(tag)
    try:
        pool = _torch_pool(tag)
        if pool is None:
            yield
        else:
            import torch
            with torch.cuda.use_mem_pool(pool):
                yield
    finally:
        set_tag(previous)


class TorchMemorySaver:
    """torch_memory_saver's singleton API over cachalloc's tags."""

    def __init__(self):
        self._disabled = threading.local()

    @contextlib.contextmanager
    def region(self, tag="default", enable_cpu_backup=False, enable_disk_backup=False, **other):
        # enable_disk_backup: the backup goes to a file (docs/PAUSE.md), and
        # wins over enable_cpu_backup (a caller who asks for disk wants to
        # spare host memory).  TMS options cachalloc has no equivalent for
        # (cpu_backup_backend, ...) are named in a warning.
        if other:
            warnings.warn("cachalloc.memory_saver: ignored torch_memory_saver options: %s (docs/PAUSE.md)"
                          % ", ".join(sorted(other)), RuntimeWarning, stacklevel=3)
        if getattr(self._disabled, "on", False):
            yield
            return
        with region(tag, cpu_backup="disk" if enable_disk_backup else enable_cpu_backup):
            yield

    @contextlib.contextmanager
    def cuda_graph(self, cuda_graph, pool=None, stream=None, capture_error_mode="global", tag="cuda_graph",
                   enable_cpu_backup=False):
        """TMS's graph capture inside a region: the graph's memory gets `tag`."""
        import torch
        with self.region(tag, enable_cpu_backup=enable_cpu_backup):
            with torch.cuda.graph(cuda_graph, pool=pool, stream=stream, capture_error_mode=capture_error_mode):
                yield

    @contextlib.contextmanager
    def disable(self):
        """Allocations inside are untagged, even inside a region."""
        self._disabled.on = True
        previous = get_tag()
        set_tag("")
        try:
            yield
        finally:
            set_tag(previous)
            self._disabled.on = False

    def pause(self, tag=None):
        pause(tag)

    def resume(self, tag=None):
        resume(tag)

    @property
    def enabled(self):
        return True

    # TMS keeps these; here they are accepted and have no effect.
    memory_margin_bytes = 0

    def set_memory_margin_bytes(self, value):
        self.memory_margin_bytes = value


torch_memory_saver = TorchMemorySaver()
