"""cachalloc.tms_compat — torch_memory_saver's Python API with TMS's semantics, over cachalloc's tags.

    from cachalloc.memory_saver import torch_memory_saver, configure_subprocess
    torch_memory_saver.hook_mode = "torch"             # or "preload" (the default)
    with torch_memory_saver.region(tag="weights", enable_cpu_backup=True): ...
    torch_memory_saver.pause("kv_cache"); torch_memory_saver.resume()

A region's allocations are paused with its tag and backed up as the region
said, allocation by allocation as in TMS: each (tag, backup) pair is a
variant of cachalloc's tag (reported as TAG+MODE), paused and resumed with
the tag.  Outside any region a thread's allocations follow TMS's
environment (TMS_INIT_ENABLE..., read by libcachalloc.so itself).

hook_mode "preload": cachalloc is preloaded (the cachalloc launcher,
configure_subprocess() for child processes, or LD_PRELOAD); with PyTorch's
own cache in front, each region allocates from a private torch.cuda.MemPool
per (tag, backup, device), as TMS does.  "torch": each region allocates
from a MemPool over cachalloc's pluggable allocator (no preload needed).

What differs from TMS, and why: docs/PAUSE.md ("For torch_memory_saver
users").  TMS's own tests reach into its implementation object
(_ensure_initialized, _impl._binary_wrapper.cdll.tms_get_*, _impl._mem_pools,
_impl._with_region_config): those answer here too, from the same state.
"""

import contextlib
import ctypes
import os
import sys
import threading

from . import memory_saver as _ms

__all__ = ["TorchMemorySaver", "torch_memory_saver", "configure_subprocess", "get_binary_path_from_package",
           "is_xpu", "alias_submodules"]

_TAG_DEFAULT = "default"
# The tag of disable() blocks: never paused by pause() without a tag, its
# cache given back when a block ends.
_DISABLED_TAG = "cachalloc.disable"
_HOOK_MODES = ("preload", "torch")
_CPU_BACKENDS = ("pinned", "mmap")


def is_xpu():
    """Whether PyTorch runs on Intel XPU (TMS's utils.is_xpu; cachalloc serves CUDA only)."""
    xpu = getattr(sys.modules.get("torch"), "xpu", None)
    try:
        return bool(xpu is not None and xpu.is_available())
    except Exception:  # noqa: BLE001 - a torch without a working XPU module
        return False


def get_binary_path_from_package(stem):
    """The library a child process preloads: libcachalloc.so (TMS ships one
    binary per hook mode, named by `stem`; cachalloc one for both)."""
    from . import library_path
    return library_path()


@contextlib.contextmanager
def _change_env(key, value):
    old = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


@contextlib.contextmanager
def configure_subprocess():
    """Child processes started inside the block preload libcachalloc.so:
    it comes first in LD_PRELOAD, the entries already there are kept, and
    LD_PRELOAD is as before after the block (TMS's; sglang starts its
    scheduler processes in it)."""
    lib = str(get_binary_path_from_package("torch_memory_saver_hook_mode_preload"))
    current = os.environ.get("LD_PRELOAD", "")
    with _change_env("LD_PRELOAD", f"{lib}:{current}" if current else lib):
        yield


def _env_bool(name):
    """TMS's reading of a boolean variable; a spelling TMS aborts on raises."""
    value = os.environ.get(name)
    if value is None or value in ("0", "false", "FALSE", "no", "NO"):
        return False
    if value in ("1", "true", "TRUE", "yes", "YES"):
        return True
    raise ValueError("%s=%r: expected 1, true, yes or 0, false, no" % (name, value))


def _env_backend():
    value = os.environ.get("TMS_INIT_CPU_BACKUP_BACKEND") or "pinned"
    if value not in _CPU_BACKENDS:
        raise ValueError("TMS_INIT_CPU_BACKUP_BACKEND=%r: expected pinned or mmap" % value)
    return value


def _backup_mode(cpu_backup, backend, disk_backup):
    if disk_backup:
        return _ms.BACKUP_DISK
    if cpu_backup:
        return _ms.BACKUP_PAGEABLE if backend == "mmap" else _ms.BACKUP_HOST
    return _ms.BACKUP_NONE


class _ThreadConfig(threading.local):
    """TMS's per-thread configuration: from its environment until a region
    (or disable()) sets it, restored when the block ends."""

    def __init__(self):
        self.tag = _TAG_DEFAULT
        self.interesting = _env_bool("TMS_INIT_ENABLE")
        self.cpu_backup = _env_bool("TMS_INIT_ENABLE_CPU_BACKUP")
        self.backend = _env_backend()
        self.disk_backup = _env_bool("TMS_INIT_ENABLE_DISK_BACKUP")

    def save(self):
        return self.tag, self.interesting, self.cpu_backup, self.backend, self.disk_backup

    def restore(self, saved):
        self.tag, self.interesting, self.cpu_backup, self.backend, self.disk_backup = saved


class _ExclusiveBackups(AssertionError, ValueError):
    """enable_cpu_backup with enable_disk_backup: TMS asserts (AssertionError);
    it is a ValueError as well."""


def _cuda_runtime():
    """The CUDA runtime library this process has mapped (PyTorch's), or None."""
    from . import _mapped_path

    path = _mapped_path("libcudart.so")
    try:
        return ctypes.CDLL(path) if path else None
    except OSError:
        return None


class _TmsCdll:
    """The reads TMS's tests make through its binary (tms_get_*), answered
    from this thread's configuration; any other name is the CUDA runtime's
    function (TMS's binary links the runtime: its tests call cudaHostGetFlags
    through it)."""

    def __init__(self, saver):
        self._saver = saver

    def tms_get_interesting_region(self):
        return bool(self._saver._config.interesting)

    def tms_get_enable_cpu_backup(self):
        return bool(self._saver._config.cpu_backup)

    def tms_get_enable_disk_backup(self):
        return bool(self._saver._config.disk_backup)

    def tms_get_current_tag(self):
        return self._saver._config.tag.encode()

    def tms_get_cpu_backup_backend(self):
        return self._saver._config.backend.encode()

    def tms_get_retain_cpu_backup(self):
        return self._saver.retain_cpu_backup

    def __getattr__(self, name):
        runtime = _cuda_runtime()
        if runtime is None or not hasattr(runtime, name):
            raise AttributeError("%s: not a torch_memory_saver read cachalloc answers, nor in a CUDA runtime "
                                 "loaded in this process" % name)
        return getattr(runtime, name)


class _BinaryWrapper:
    def __init__(self, saver):
        self.cdll = _TmsCdll(saver)


class TorchMemorySaver:
    """torch_memory_saver's singleton API (TMS's torch_memory_saver.TorchMemorySaver)."""

    def __init__(self):
        self._hook_mode = "preload"
        self._initialized = False
        self._init_lock = threading.Lock()
        self._thread_config = None  # made at the first use: the environment is read then, not at import
        self._mem_pools = {}  # TMS's key (tag, cpu, disk, backend, device) -> torch.cuda.MemPool
        self._margin = 0
        self._binary_wrapper = _BinaryWrapper(self)

    # ---- configuration ----

    @property
    def _config(self):
        """The calling thread's TMS configuration (_ThreadConfig)."""
        if self._thread_config is None:
            with self._init_lock:
                if self._thread_config is None:
                    self._thread_config = _ThreadConfig()
        return self._thread_config

    @property
    def hook_mode(self):
        return self._hook_mode

    @hook_mode.setter
    def hook_mode(self, hook_mode):
        if hook_mode not in _HOOK_MODES:
            raise ValueError("hook_mode must be 'preload' or 'torch', not %r" % (hook_mode,))
        if self._initialized and hook_mode != self._hook_mode:
            raise RuntimeError("hook_mode cannot change after the first use (it is %r)" % self._hook_mode)
        self._hook_mode = hook_mode

    @property
    def enabled(self):
        return True

    @property
    def memory_margin_bytes(self):
        return self._margin

    @memory_margin_bytes.setter
    def memory_margin_bytes(self, value):
        _ms.set_memory_margin(value)
        self._margin = int(value)

    def set_memory_margin_bytes(self, value):
        self.memory_margin_bytes = value

    @property
    def retain_cpu_backup(self):
        """Whether host backups outlive the resume (TMS_RETAIN_CPU_BACKUP); read at each resume."""
        self._ensure_initialized()
        return _ms.get_tag_retain_backup(None)

    @retain_cpu_backup.setter
    def retain_cpu_backup(self, value):
        self._ensure_initialized()
        _ms.set_tag_retain_backup(None, bool(value))

    def set_disk_backup_dir(self, path):
        """Disk backups go to `path` (made if needed): a named file per
        allocation while its tag is paused, removed at the resume."""
        self._ensure_initialized()
        path = os.path.abspath(path)
        os.makedirs(path, exist_ok=True)
        _ms.set_pause_backup_dir(path, named=True)

    # ---- TMS's implementation object, as its tests reach it ----

    def _ensure_initialized(self):
        with self._init_lock:
            if self._initialized:
                return
            _ms._lib()  # the library, found or loaded, prototypes declared
            _ms.set_tag_in_pause_all(_DISABLED_TAG, False)
            # TMS gives host backups back at the resume unless told to retain
            # them; cachalloc's own default keeps them (the library reads
            # TMS_RETAIN_CPU_BACKUP itself, which then decides).
            if os.environ.get("TMS_RETAIN_CPU_BACKUP") is None:
                _ms.set_tag_retain_backup(None, False)
            self._initialized = True

    @property
    def _impl(self):
        self._ensure_initialized()
        return self

    @property
    def _is_xpu(self):
        return is_xpu()

    # ---- regions ----

    def _validate_cpu_backup_backend(self, enable_cpu_backup, cpu_backup_backend):
        if cpu_backup_backend is None:
            return
        if not enable_cpu_backup:
            raise ValueError("cpu_backup_backend requires enable_cpu_backup=True")
        if is_xpu():
            raise ValueError("cpu_backup_backend is not supported on XPU; host shadows use malloc")
        torch = sys.modules.get("torch")
        if cpu_backup_backend == "mmap" and getattr(getattr(torch, "version", None), "hip", None):
            raise ValueError("cpu_backup_backend='mmap' is not supported on ROCm")
        if cpu_backup_backend not in _CPU_BACKENDS:
            raise ValueError("cpu_backup_backend must be 'pinned' or 'mmap', not %r" % (cpu_backup_backend,))

    def _pool(self, tag, enable_cpu_backup, enable_disk_backup, cpu_backup_backend):
        """The MemPool a region allocates from, one per TMS's key (tag,
        backups, resolved backend, device), or None when its allocations
        reach cachalloc without one (no PyTorch cache in front: the key then
        maps to None, so that code which takes a region's pool out of
        _mem_pools, as TMS's tests do, finds the entry)."""
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        backend = (cpu_backup_backend or self._config.backend) if enable_cpu_backup else ""
        key = (tag, enable_cpu_backup, enable_disk_backup, backend, torch.cuda.current_device())
        if _ms._torch_is_cachalloc() or (self._hook_mode == "preload" and not _ms._torch_cache_in_front()):
            # cachalloc serves PyTorch (use_with_torch: it tags the region's
            # tensors itself, and PyTorch's pluggable wrapper refuses pools),
            # or nothing caches in front of it
            self._mem_pools.setdefault(key, None)
            return None
        pool = self._mem_pools.get(key)
        if pool is None:
            if self._hook_mode == "torch":
                from . import pluggable_allocator
                pool = torch.cuda.MemPool(pluggable_allocator().allocator())
            else:
                pool = torch.cuda.MemPool()
            self._mem_pools[key] = pool
        return pool

    @contextlib.contextmanager
    def region(self, tag=_TAG_DEFAULT, enable_cpu_backup=False, enable_disk_backup=False, cpu_backup_backend=None):
        """Allocations of this thread inside the block are paused with `tag`,
        backed up in host memory (enable_cpu_backup; cpu_backup_backend
        "pinned" or "mmap": pageable), on disk (enable_disk_backup) or not."""
        self._validate_cpu_backup_backend(enable_cpu_backup, cpu_backup_backend)
        if enable_cpu_backup and enable_disk_backup:
            raise _ExclusiveBackups("enable_cpu_backup and enable_disk_backup are mutually exclusive")
        self._ensure_initialized()
        with _ms._in_pool(self._pool(tag, enable_cpu_backup, enable_disk_backup, cpu_backup_backend)):
            with self._with_region_config(tag=tag, enable_cpu_backup=enable_cpu_backup,
                                          cpu_backup_backend=cpu_backup_backend,
                                          enable_disk_backup=enable_disk_backup):
                yield

    @contextlib.contextmanager
    def _with_region_config(self, tag, enable_cpu_backup, cpu_backup_backend, enable_disk_backup=False):
        """The thread's configuration inside a region, without a pool (TMS's)."""
        if not tag:
            raise ValueError("a region needs a tag name")
        config = self._config
        saved, saved_tag = config.save(), _ms._thread_tag_state()
        config.tag, config.interesting = tag, True
        config.cpu_backup, config.disk_backup = bool(enable_cpu_backup), bool(enable_disk_backup)
        if cpu_backup_backend is not None:
            config.backend = cpu_backup_backend
        _ms._set_thread_tag_state(tag, _backup_mode(config.cpu_backup, config.backend, config.disk_backup))
        try:
            yield
        finally:
            config.restore(saved)
            _ms._set_thread_tag_state(*saved_tag)

    @contextlib.contextmanager
    def cuda_graph(self, cuda_graph, pool=None, stream=None, capture_error_mode="global", tag=_TAG_DEFAULT,
                   enable_cpu_backup=False, cpu_backup_backend=None):
        """torch.cuda.graph, with the memory the capture allocates pausable under `tag`."""
        self._validate_cpu_backup_backend(enable_cpu_backup, cpu_backup_backend)
        self._ensure_initialized()
        if self._hook_mode != "preload":
            raise AssertionError("Only hook_mode=preload supports pauseable CUDA Graph currently")
        import torch
        with torch.cuda.graph(cuda_graph, pool=pool, stream=stream, capture_error_mode=capture_error_mode):
            with self._with_region_config(tag=tag, enable_cpu_backup=enable_cpu_backup,
                                          cpu_backup_backend=cpu_backup_backend):
                yield

    @contextlib.contextmanager
    def disable(self, dispose_mem_pool_after_use=True):
        """Allocations inside are not pausable, even inside a region; what
        they leave cached goes back to the device when the block ends."""
        if not dispose_mem_pool_after_use:
            raise AssertionError("Only dispose_mem_pool_after_use=true is supported now")
        self._ensure_initialized()
        config = self._config
        saved, saved_tag = config.interesting, _ms._thread_tag_state()
        config.interesting = False
        _ms._set_thread_tag_state(_DISABLED_TAG, _ms.BACKUP_TAG)  # (never backed up: never paused)
        try:
            # PyTorch's cache in front (always in hook mode "torch", as in
            # TMS): a pool of the block's own, whose segments PyTorch frees
            # with it, into the disable tag's cache, emptied below.
            torch = sys.modules.get("torch")
            in_front = torch is not None and not _ms._torch_is_cachalloc() and (
                self._hook_mode == "torch" or _ms._torch_cache_in_front())
            pool = torch.cuda.MemPool() if in_front else None
            with _ms._in_pool(pool):
                yield
            del pool
        finally:
            config.interesting = saved
            _ms._set_thread_tag_state(*saved_tag)
            _ms.empty_tag_cache(_DISABLED_TAG)

    # ---- pause, resume, backups ----

    def pause(self, tag=None):
        """Pauses `tag` (None or "": every tag but disable()'s)."""
        self._ensure_initialized()
        _ms.pause(tag or None)

    def resume(self, tag=None):
        self._ensure_initialized()
        _ms.resume(tag or None)

    def get_cpu_backup(self, x, zero_copy=False):
        """The host backup of CUDA tensor `x` (contiguous) as a CPU tensor of
        its dtype and shape, while a host backup holds it (paused with one,
        or retained after the resume), else None.  zero_copy: a view of
        cachalloc's buffer, valid until the tag's next resume (retained: its
        next pause); otherwise a copy."""
        import torch
        assert x.is_cuda, f"{x.device=}"
        assert x.is_contiguous(), f"{x.shape=} {x.stride()=} {x.dtype=}"
        self._ensure_initialized()
        nbytes = x.nbytes
        host = _ms.backup_pointer(x.data_ptr(), nbytes)
        if host is None:
            return None
        if nbytes == 0:
            return torch.empty(x.shape, dtype=x.dtype)
        raw = torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(host), dtype=torch.uint8)
        ans = raw.view(x.dtype).view(x.shape)
        return ans if zero_copy else ans.clone()


def alias_submodules(package):
    """Makes `package`, a module standing in for torch_memory_saver (its
    __init__ imports cachalloc.memory_saver's names), answer for TMS's
    submodules too: `package.entrypoint`, `package.hooks.mode_preload` are
    this module itself, so that what code patches there (TMS's tests patch
    entrypoint.is_xpu and hooks.mode_preload.get_binary_path_from_package)
    is what cachalloc calls.  Call it from that __init__:
    alias_submodules(__name__)."""
    import types
    me = sys.modules[__name__]
    hooks = types.ModuleType(package + ".hooks", "torch_memory_saver.hooks, mapped onto cachalloc.tms_compat")
    hooks.__path__ = []  # a package: its submodule is found in sys.modules
    hooks.mode_preload = me
    for name, module in (("entrypoint", me), ("hooks", hooks), ("hooks.mode_preload", me)):
        sys.modules[package + "." + name] = module
    parent = sys.modules[package]
    parent.entrypoint, parent.hooks = me, hooks


torch_memory_saver = TorchMemorySaver()
