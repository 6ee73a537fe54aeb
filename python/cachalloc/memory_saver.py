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

(cachalloc.tms_compat, re-exported here with configure_subprocess).  What
differs from TMS is in docs/PAUSE.md ("For torch_memory_saver users").
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

from . import CachallocError, ERROR_INVALID_VALUE, ERROR_NOT_INITIALIZED, SUCCESS, load

__all__ = ["region", "pause", "resume", "set_tag", "get_tag", "tag_paused", "set_tag_backup",
           "set_tag_retain_backup", "get_tag_retain_backup", "backup_pointer", "set_pause_backup_dir",
           "empty_tag_cache", "set_tag_in_pause_all", "set_memory_margin",
           "TorchMemorySaver", "torch_memory_saver", "configure_subprocess"]

# include/cachalloc.h's CACHALLOC_BACKUP_* and CACHALLOC_TAG_PROCESS.
BACKUP_TAG, BACKUP_NONE, BACKUP_HOST, BACKUP_DISK, BACKUP_PAGEABLE = -1, 0, 1, 2, 3
TAG_PROCESS = -2

_protos_lock = threading.Lock()
_declared = False

_c_int, _c_char_p, _c_size_t, _c_void_p = ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p
# (name, restype, argtypes, required): the later ones arrived with issue 35;
# calling one a library lacks raises.
_PROTOS = (
    ("cachalloc_set_tag", _c_int, [_c_char_p], True),
    ("cachalloc_get_tag", _c_int, [_c_char_p, _c_size_t], True),
    ("cachalloc_set_tag_backup", _c_int, [_c_char_p, _c_int], True),
    ("cachalloc_pause", _c_int, [_c_char_p], True),
    ("cachalloc_resume", _c_int, [_c_char_p], True),
    ("cachalloc_tag_paused", _c_int, [_c_char_p], True),
    ("cachalloc_set_tag_with_backup", _c_int, [_c_char_p, _c_int], False),
    ("cachalloc_get_tag_with_backup", _c_int, [_c_char_p, _c_size_t, ctypes.POINTER(_c_int)], False),
    ("cachalloc_set_tag_retain_backup", _c_int, [_c_char_p, _c_int], False),
    ("cachalloc_get_tag_retain_backup", _c_int, [_c_char_p], False),
    ("cachalloc_get_backup_pointer", _c_int, [_c_void_p, _c_size_t, ctypes.POINTER(_c_void_p)], False),
    ("cachalloc_set_pause_backup_dir", _c_int, [_c_char_p, _c_int], False),
    ("cachalloc_empty_tag_cache", _c_int, [_c_char_p], False),
    ("cachalloc_set_tag_in_pause_all", _c_int, [_c_char_p, _c_int], False),
    ("cachalloc_set_memory_margin", _c_int, [_c_size_t], False),
)


def _lib():
    global _declared
    lib = load()
    with _protos_lock:
        if not _declared:
            for name, restype, argtypes, required in _PROTOS:
                fn = getattr(lib, name, None)
                if fn is None:
                    if required:
                        raise CachallocError(name, ERROR_INVALID_VALUE, "this libcachalloc.so predates tags")
                    continue
                fn.restype, fn.argtypes = restype, argtypes
            _declared = True
    return lib


def _fn(name):
    fn = getattr(_lib(), name, None)
    if fn is None:
        raise CachallocError(name, ERROR_INVALID_VALUE, "this libcachalloc.so predates it (issue 35)")
    return fn


def _name(tag):
    return None if tag is None else str(tag).encode()


def _call(function, *args, allow=()):
    code = _fn(function)(*args)
    if code != SUCCESS and code not in allow:
        raise CachallocError(function, code)
    return code


def set_tag(tag):
    """Sets the calling thread's tag (None or "": untagged)."""
    _call("cachalloc_set_tag", _name(tag or ""))


def get_tag():
    """The calling thread's tag ("" when untagged)."""
    buf = ctypes.create_string_buffer(64)
    _call("cachalloc_get_tag", buf, 64)
    return buf.value.decode()


def _thread_tag_state():
    """(tag, mode) of the calling thread, for _set_thread_tag_state to restore:
    mode TAG_PROCESS when the thread set no tag, BACKUP_TAG when its
    allocations follow the tag's own backup, else their own (a variant)."""
    buf = ctypes.create_string_buffer(64)
    mode = ctypes.c_int(BACKUP_TAG)
    _call("cachalloc_get_tag_with_backup", buf, 64, ctypes.byref(mode))
    return buf.value.decode(), mode.value


def _set_thread_tag_state(tag, mode):
    """The calling thread's tag, its allocations backed up as `mode`
    (BACKUP_TAG: the tag's own; TAG_PROCESS: no tag of its own)."""
    _call("cachalloc_set_tag_with_backup", _name(tag or ""), mode)


_BACKUP_MODES = {"none": BACKUP_NONE, "host": BACKUP_HOST, "cpu": BACKUP_HOST, "pinned": BACKUP_HOST,
                 "disk": BACKUP_DISK, "pageable": BACKUP_PAGEABLE, "mmap": BACKUP_PAGEABLE}


def _backup_mode(mode):
    """C's CACHALLOC_BACKUP_* for True/False/None or "none"/"host"/"pageable"/"disk"."""
    if isinstance(mode, str):
        try:
            return _BACKUP_MODES[mode.lower()]
        except KeyError:
            raise CachallocError("set_tag_backup", ERROR_INVALID_VALUE,
                                 "backup mode %r: expected True, False, 'host', 'pageable', 'disk' or 'none'"
                                 % (mode,)) from None
    return BACKUP_HOST if mode else BACKUP_NONE


def set_tag_backup(tag, enable=True):
    """Where pause(tag) copies the tag's live memory: True or "host" (pinned
    host memory), "pageable" (pageable host memory: nothing pinned, slower
    copies), "disk" (files in CACHALLOC_CONF's pause_backup_dir, default
    $TMPDIR or /tmp, or set_pause_backup_dir's, through a small pinned
    staging buffer: for tags larger than the host memory to spare), False
    or "none" (no backup: contents are lost at pause).  A host backup is
    given back at the resume unless the tag retains it."""
    _call("cachalloc_set_tag_backup", _name(tag), _backup_mode(enable))


def set_tag_retain_backup(tag=None, retain=True):
    """Whether the tag's host backup outlives its resume (tag None: every
    tag).  Read at each resume; a retained backup holds the contents of the
    pause (backup_pointer) and is refilled in place by the next pause."""
    _call("cachalloc_set_tag_retain_backup", _name(tag), 1 if retain else 0)


def get_tag_retain_backup(tag=None):
    code = _fn("cachalloc_get_tag_retain_backup")(_name(tag))
    if code < 0:
        raise CachallocError("cachalloc_get_tag_retain_backup", -code)
    return code == 1


def backup_pointer(ptr, size):
    """The host address where a host backup holds device bytes [ptr,
    ptr+size) now (paused with a host backup, or retained after the
    resume), or None.  Raises CachallocError for memory cachalloc did not
    serve."""
    host = ctypes.c_void_p()
    _call("cachalloc_get_backup_pointer", ctypes.c_void_p(int(ptr)), int(size), ctypes.byref(host))
    return host.value


def set_pause_backup_dir(path, named=False):
    """Disk backups go to `path` from the next pause on (None: the
    configured pause_backup_dir again); named=True gives their files names
    there (visible to ls and du while paused, removed at the resume)."""
    _call("cachalloc_set_pause_backup_dir", None if path is None else os.fsencode(path), 1 if named else 0)


def empty_tag_cache(tag):
    """Gives the tag's cached free memory back to the device (every device);
    other tags and untagged memory keep their cache.  Nothing to do before
    cachalloc has served anything."""
    _call("cachalloc_empty_tag_cache", _name(tag), allow=(ERROR_NOT_INITIALIZED,))


def set_tag_in_pause_all(tag, included=True):
    """Whether pause()/resume() without a tag take `tag` (default True)."""
    _call("cachalloc_set_tag_in_pause_all", _name(tag), 1 if included else 0)


def set_memory_margin(nbytes):
    """A tagged allocation that needs new device memory fails (out of
    memory) when the device would be left with less than `nbytes` free; 0
    removes the margin."""
    nbytes = int(nbytes)
    if nbytes < 0:
        raise ValueError("memory margin must be >= 0, not %d" % nbytes)
    _call("cachalloc_set_memory_margin", nbytes)


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


def _torch_is_cachalloc():
    """Whether cachalloc is PyTorch's allocator (use_with_torch())."""
    from . import _torch_swapped
    return _torch_swapped


def _torch_cache_in_front():
    """Whether PyTorch's own caching allocator serves tensors above a
    preloaded cachalloc (it would mix tags in its cache: regions then
    allocate from a private torch.cuda.MemPool per tag)."""
    import sys
    torch = sys.modules.get("torch")
    if torch is None or os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1" or _torch_is_cachalloc():
        return False  # every tensor reaches cachalloc (no PyTorch cache), or the pluggable allocator
    try:
        backend = torch.cuda.memory.get_allocator_backend() if hasattr(torch.cuda.memory, "get_allocator_backend") \
            else torch.cuda.get_allocator_backend()
    except Exception:  # noqa: BLE001 - an old torch: assume its own allocator
        backend = "native"
    return backend == "native" and hasattr(torch.cuda, "MemPool")


def _torch_pool(tag):
    """region()'s private torch.cuda.MemPool for `tag` where PyTorch's cache is in front, else None."""
    if not _torch_cache_in_front():
        return None
    import torch
    pool = _pools.get(tag)
    if pool is None:
        pool = _pools[tag] = torch.cuda.MemPool()
    return pool


@contextlib.contextmanager
def _in_pool(pool):
    if pool is None:
        yield
        return
    import torch
    with torch.cuda.use_mem_pool(pool):
        yield


@contextlib.contextmanager
def region(tag, cpu_backup=False):
    """Allocations of this thread inside the block belong to `tag`.
    cpu_backup: True (or "host") backs the tag up in pinned host memory at
    its pauses, "pageable" in pageable host memory, "disk" in files
    (set_tag_backup); False leaves the tag's backup as it was set before."""
    if not tag:
        raise CachallocError("region", ERROR_INVALID_VALUE, "a region needs a tag name")
    if cpu_backup:
        set_tag_backup(tag, cpu_backup)
    previous = _thread_tag_state()
    set_tag(tag)
    try:
        with _in_pool(_torch_pool(tag)):
            yield
    finally:
        _set_thread_tag_state(*previous)


# torch_memory_saver's API (TMS's semantics, tms_compat.py).
from .tms_compat import TorchMemorySaver, torch_memory_saver, configure_subprocess  # noqa: E402
