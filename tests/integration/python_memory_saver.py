#!/usr/bin/env python3
"""python_memory_saver.py — cachalloc's tags from Python, and the
torch_memory_saver drop-in (cachalloc.memory_saver, cachalloc.tms_compat),
against the fake libcuda.so.1 through the pluggable ABI (cachalloc_malloc),
no torch needed.  TMS's semantics checked here: a backup per region (not
per tag), host backups given back at the resume unless retained, disk
backups as named files in set_disk_backup_dir's directory, disable()
giving its memory back at its end, TMS's environment, its ValueErrors,
configure_subprocess, hook_mode, memory_margin_bytes.

Usage: python_memory_saver.py MODULE_DIR LIBCACHALLOC
"""
import ctypes
import os
import subprocess
import sys
import tempfile
import types

MiB = 1 << 20


def check(cond, what):
    if not cond:
        print(f"python_memory_saver: FAIL: {what}")
        sys.exit(1)


def raises(exc, fn, *args, match=""):
    try:
        fn(*args)
    except exc as e:
        return match in str(e)
    return False


class Env:
    """The fake device, the library, and helpers shared by the checks."""

    def __init__(self):
        import cachalloc
        self.cachalloc = cachalloc
        self.cuda = ctypes.CDLL("libcuda.so.1")
        check(self.cuda.cuInit(0) == 0, "cuInit")
        ctx = ctypes.c_void_p()
        check(self.cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0, "retain")
        check(self.cuda.cuCtxSetCurrent(ctx) == 0, "set current")
        self.cuda.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
        self.cuda.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
        self.lib = cachalloc.load()

    def alloc(self, n):
        p = self.lib.cachalloc_malloc(n, 0, None)
        check(p, "cachalloc_malloc")
        return p

    def free(self, *ptrs):
        for p in ptrs:
            self.lib.cachalloc_free(p, 0, 0, None)

    @staticmethod
    def pattern(n, seed):
        return bytes((i * 31 + seed) & 0xFF for i in range(256)) * (n // 256) + bytes(n % 256)

    def write(self, p, data):
        check(self.cuda.cuMemcpyHtoD_v2(p, data, len(data)) == 0, "write")

    def read(self, p, n):
        back = ctypes.create_string_buffer(n)
        check(self.cuda.cuMemcpyDtoH_v2(back, p, n) == 0, "read")
        return back.raw

    def tags(self):
        return self.cachalloc.stats()["devices"][0]["tags"]


def host_mapped(addr):
    """Whether `addr` lies in a mapping of this process."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                return True
    return False


def regions_and_variants(env, tms):
    """A backup per region, not per tag (TMS's): in one tag, the backed-up
    allocations come back, the others do not; the tag pauses as a whole."""
    cachalloc = env.cachalloc
    check(cachalloc.get_tag() == "", "untagged at start")
    cdll = tms._impl._binary_wrapper.cdll
    check(cdll.tms_get_interesting_region() is False and cdll.tms_get_current_tag() == b"default",
          "TMS's thread state outside a region")
    with tms.region("weights", enable_cpu_backup=True):
        check(cachalloc.get_tag() == "weights", "region sets the tag")
        check(cdll.tms_get_interesting_region() and cdll.tms_get_enable_cpu_backup(), "region's state")
        check(cdll.tms_get_current_tag() == b"weights" and cdll.tms_get_cpu_backup_backend() == b"pinned",
              "region's tag and backend")
        w = env.alloc(30 * MiB)
        with tms.region("weights", enable_cpu_backup=False):  # nested, same tag, no backup
            check(not cdll.tms_get_enable_cpu_backup(), "nested region's state")
            scratch = env.alloc(8 * MiB)
        check(cdll.tms_get_enable_cpu_backup(), "the outer region's state is back")
    check(cachalloc.get_tag() == "" and not cdll.tms_get_interesting_region(), "state restored after the regions")
    with cachalloc.region("kv_cache"):
        k = env.alloc(20 * MiB)
    data = env.pattern(30 * MiB, 1)
    env.write(w, data)
    env.write(scratch, env.pattern(8 * MiB, 2))
    tms.pause("weights")
    tms.pause("weights")  # a no-op (warning), no exit
    check(cachalloc.tag_paused("weights") and not cachalloc.tag_paused("kv_cache"), "paused by name")
    tags = env.tags()
    check(tags["weights+host"]["paused_bytes"] >= 30 * MiB and tags["weights+host"]["backup_bytes"] >= 30 * MiB,
          f"the backed-up variant: {tags.get('weights+host')}")
    check(tags["weights+none"]["paused"] and tags["weights+none"]["backup_bytes"] == 0, "the other variant")
    with tms.region("weights"):
        check(env.lib.cachalloc_malloc(1000, 0, None) is None, "allocation in a paused tag refused")
    tms.pause("")  # TMS: "" is every tag
    check(cachalloc.tag_paused("kv_cache"), "pause('') pauses every tag")
    tms.resume()
    check(not cachalloc.tag_paused("weights"), "resumed")
    check(env.read(w, 30 * MiB) == data, "weights restored at the same address")
    check(env.read(scratch, 8 * MiB) == bytes(8 * MiB), "the region without a backup lost its contents")
    check(env.tags()["weights+host"]["num_pauses"] == 1, "counts")
    try:
        cachalloc.pause("")
        check(False, "pausing the untagged memory must fail")
    except cachalloc.CachallocError as e:
        check(e.code == 1, "CachallocError(INVALID_VALUE)")
    env.free(w, scratch, k)


def host_backups(env, tms):
    """The host backup goes back at the resume unless retained; retained,
    it stays at the same address with the pause's contents, refilled there
    by the next pause; pageable (mmap) backups are unmapped."""
    cachalloc = env.cachalloc
    check(tms.retain_cpu_backup is False, "retain_cpu_backup is False by default")
    with tms.region("host", enable_cpu_backup=True):
        h = env.alloc(24 * MiB)
    with tms.region("page", enable_cpu_backup=True, cpu_backup_backend="mmap"):
        check(tms._impl._binary_wrapper.cdll.tms_get_cpu_backup_backend() == b"mmap", "the region's backend")
        pg = env.alloc(40 * MiB)
    env.write(h, env.pattern(24 * MiB, 3))
    env.write(pg, env.pattern(40 * MiB, 4))
    tms.pause()
    check(cachalloc.backup_pointer(h, 16) is not None, "a paused host backup answers")
    page_host = cachalloc.backup_pointer(pg, 40 * MiB)
    check(ctypes.string_at(page_host, 40 * MiB) == env.pattern(40 * MiB, 4), "the pause's bytes, in the backup")
    tags = env.tags()
    check(tags["page+pageable"]["backup_mode"] == "pageable" and tags["page+pageable"]["backup_capacity_bytes"] > 0,
          f"a pageable backup: {tags['page+pageable']}")
    check(host_mapped(page_host), "its pages are mapped while paused")
    tms.resume()
    check(env.read(h, 24 * MiB) == env.pattern(24 * MiB, 3), "pinned: restored")
    check(env.read(pg, 40 * MiB) == env.pattern(40 * MiB, 4), "pageable: restored")
    tags = env.tags()
    check(tags["host+host"]["backup_capacity_bytes"] == 0 and tags["page+pageable"]["backup_capacity_bytes"] == 0,
          "both host buffers given back at the resume")
    check(not host_mapped(page_host), "the pageable backup is unmapped: resident memory dropped")
    check(cachalloc.backup_pointer(h, 16) is None, "no backup after the resume")

    tms.retain_cpu_backup = True
    check(tms.retain_cpu_backup is True, "retain_cpu_backup is True once set")
    tms.pause("host")
    first = cachalloc.backup_pointer(h + 4096, 1000)
    tms.resume("host")
    check(cachalloc.backup_pointer(h + 4096, 1000) == first, "retained: the same address after the resume")
    check(env.tags()["host+host"]["backup_retained_bytes"] >= 24 * MiB, "counted as retained")
    tms.retain_cpu_backup = False
    check(cachalloc.backup_pointer(h + 4096, 1000) == first, "the backup held stays until the next resume")
    env.write(h, env.pattern(24 * MiB, 5))
    tms.pause("host")
    check(cachalloc.backup_pointer(h + 4096, 1000) == first, "refilled in place by the next pause")
    check(ctypes.string_at(first - 4096, 24 * MiB) == env.pattern(24 * MiB, 5), "with the new contents")
    tms.resume("host")
    check(cachalloc.backup_pointer(h + 4096, 1000) is None, "not retained this time: given back")
    check(env.tags()["host+host"]["backup_capacity_bytes"] == 0, "its memory with it")
    env.free(h, pg)


def disk_backups(env, tms):
    """set_disk_backup_dir: a named file per allocation of a disk-backed
    region in the directory while paused (TMS's test counts them), the same
    bytes on disk every cycle, gone at the resume."""
    with tempfile.TemporaryDirectory() as base:
        disk_dir = os.path.join(base, "made")  # set_disk_backup_dir makes it
        tms.set_disk_backup_dir(disk_dir)
        numel = MiB * 13 // 4 + 12345
        with tms.region(enable_disk_backup=True):
            big = env.alloc(numel * 4)
            small = env.alloc(7)
        with tms.region(enable_disk_backup=False):
            no_backup = env.alloc(20 * MiB)
        big_data = env.pattern(numel * 4, 6)
        env.write(big, big_data)
        env.write(small, b"\x0a" * 7)
        env.write(no_backup, b"\x14" * (20 * MiB))
        sizes = set()
        for _ in range(3):
            tms.pause()
            files = os.listdir(disk_dir)
            total = sum(os.path.getsize(os.path.join(disk_dir, f)) for f in files)
            check(len(files) == 2, f"a backup file per allocation, named: {files}")
            check(total >= numel * 4, f"the files hold the paused tensor: {total}")
            sizes.add(total)
            check(env.tags()["default+disk"]["backup_disk_files"] == len(files), "counted in the statistics")
            tms.resume()
            check(os.listdir(disk_dir) == [], "the files go at the resume")
            check(env.read(big, numel * 4) == big_data and env.read(small, 7) == b"\x0a" * 7, "restored from disk")
            check(env.read(no_backup, 3) != b"\x14" * 3, "the region without a backup is not")
        check(len(sizes) == 1, f"disk use constant over cycles: {sizes}")
        env.free(big, small, no_backup)
        env.cachalloc.set_pause_backup_dir(None)


def disable_regions(env, tms):
    """disable(): inside, allocations are not pausable, even in a region;
    what they leave cached goes back to the device when the block ends."""
    cachalloc = env.cachalloc
    with tms.region("kept", enable_cpu_backup=True):
        kept = env.alloc(10 * MiB)
        with tms.disable():
            check(not tms._impl._binary_wrapper.cdll.tms_get_interesting_region(), "disable()'s state")
            check(cachalloc.get_tag() == "cachalloc.disable", "its own tag")
            scratch = env.alloc(40 * MiB)
            live = env.alloc(2 * MiB)
            env.write(live, env.pattern(2 * MiB, 7))
            tms.pause()  # leaves the disabled memory alone
            check(not cachalloc.tag_paused("cachalloc.disable") and cachalloc.tag_paused("kept"), "pause() in disable()")
            check(env.read(live, 2 * MiB) == env.pattern(2 * MiB, 7), "disabled memory still usable")
            tms.resume()
            env.free(scratch)
            check(env.tags()["cachalloc.disable"]["reserved_bytes"] >= 40 * MiB, "cached while inside")
        check(cachalloc.get_tag() == "kept", "the region's tag is back")
    check(env.tags()["cachalloc.disable"]["reserved_bytes"] < 40 * MiB, "given back at the end of the block")
    check(env.read(live, 2 * MiB) == env.pattern(2 * MiB, 7), "a block still live keeps its memory")
    env.free(kept, live)


def value_errors(env, tms):
    """Where TMS raises ValueError (its test_utils.py), and its other refusals."""
    from cachalloc import tms_compat
    TMS = tms_compat.TorchMemorySaver

    def enter(saver, **kw):
        with saver.region(**kw):
            pass

    check(raises(ValueError, lambda: enter(TMS(), enable_cpu_backup=False, cpu_backup_backend="mmap"),
                 match="requires enable_cpu_backup"), "backend without a CPU backup")
    check(raises(ValueError, lambda: enter(TMS(), enable_cpu_backup=True, cpu_backup_backend="tape"),
                 match="pinned"), "an unknown backend")
    both = lambda: enter(TMS(), enable_cpu_backup=True, enable_disk_backup=True)  # noqa: E731
    check(raises(ValueError, both, match="mutually exclusive") and raises(AssertionError, both),
          "CPU and disk backups at once: ValueError, and TMS's AssertionError")
    saved_is_xpu = tms_compat.is_xpu
    tms_compat.is_xpu = lambda: True  # as TMS's test patches its entrypoint module
    try:
        for backend in ("pinned", "mmap"):
            check(raises(ValueError, lambda: enter(TMS(), enable_cpu_backup=True, cpu_backup_backend=backend),
                         match="not supported on XPU"), f"XPU, {backend}")
    finally:
        tms_compat.is_xpu = saved_is_xpu
    sys.modules["torch"] = types.SimpleNamespace(version=types.SimpleNamespace(hip="6.2.0"))
    try:
        check(raises(ValueError, lambda: enter(TMS(), enable_cpu_backup=True, cpu_backup_backend="mmap"),
                     match="not supported on ROCm"), "mmap on ROCm")
    finally:
        del sys.modules["torch"]
    fresh = TMS()
    check(raises(ValueError, setattr, fresh, "hook_mode", "ptrace"), "an unknown hook mode")
    fresh.hook_mode = "torch"
    check(fresh.hook_mode == "torch", "hook_mode set before the first use")
    fresh._ensure_initialized()
    check(raises(RuntimeError, setattr, fresh, "hook_mode", "preload"), "hook_mode changed after the first use")
    check(raises(ValueError, setattr, tms, "memory_margin_bytes", -1), "a negative margin")


def subprocess_env(env, tms):
    """configure_subprocess(): libcachalloc.so first in LD_PRELOAD for the
    block, the entries there kept, LD_PRELOAD as before afterwards (TMS's
    test_configure_subprocess.py, with the path patched the same way)."""
    from cachalloc import tms_compat
    from cachalloc.memory_saver import configure_subprocess
    lib = env.cachalloc.library_path()
    saved = os.environ.pop("LD_PRELOAD", None)
    try:
        with configure_subprocess():
            check(os.environ["LD_PRELOAD"] == lib, "unset: the library alone")
            child = subprocess.run([sys.executable, "-c", "import os; print(os.environ['LD_PRELOAD'])"],
                                   capture_output=True, text=True, env={**os.environ, "LD_PRELOAD": ""})
            check(child.returncode == 0, "a child runs")
        check("LD_PRELOAD" not in os.environ, "unset again after the block")
        os.environ["LD_PRELOAD"] = "/other/lib.so"
        real = tms_compat.get_binary_path_from_package
        tms_compat.get_binary_path_from_package = lambda stem: "/fake/preload.so"
        try:
            with configure_subprocess():
                parts = os.environ["LD_PRELOAD"].split(":")
                check(parts[0] == "/fake/preload.so" and "/other/lib.so" in parts, f"prepended: {parts}")
        finally:
            tms_compat.get_binary_path_from_package = real
        check(os.environ["LD_PRELOAD"] == "/other/lib.so", "restored after the block")
    finally:
        if saved is None:
            os.environ.pop("LD_PRELOAD", None)
        else:
            os.environ["LD_PRELOAD"] = saved


MAPPING = """
from cachalloc.memory_saver import *  # noqa
from cachalloc.memory_saver import torch_memory_saver, TorchMemorySaver  # noqa
from cachalloc.tms_compat import alias_submodules
alias_submodules(__name__)
"""


def module_mapping(env, tms):
    """A `torch_memory_saver` package mapped onto cachalloc answers for TMS's
    submodules, and patches made there reach cachalloc (as TMS's tests
    patch them)."""
    from unittest import mock
    from cachalloc import tms_compat
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "torch_memory_saver"))
        with open(os.path.join(root, "torch_memory_saver", "__init__.py"), "w") as f:
            f.write(MAPPING)
        sys.path.insert(0, root)
        try:
            import torch_memory_saver
            from torch_memory_saver.entrypoint import TorchMemorySaver
            from torch_memory_saver import entrypoint as entrypoint_mod
            from torch_memory_saver.hooks.mode_preload import configure_subprocess
            check(torch_memory_saver.torch_memory_saver is tms and TorchMemorySaver is tms_compat.TorchMemorySaver,
                  "the singleton and the class")
            check(entrypoint_mod is tms_compat and torch_memory_saver.configure_subprocess is configure_subprocess,
                  "entrypoint and hooks.mode_preload are tms_compat")
            saved = os.environ.pop("LD_PRELOAD", None)
            try:
                with mock.patch("torch_memory_saver.hooks.mode_preload.get_binary_path_from_package",
                                return_value="/fake/lib.so"):
                    with torch_memory_saver.configure_subprocess():
                        check(os.environ["LD_PRELOAD"] == "/fake/lib.so", "a patch there reaches cachalloc")
            finally:
                if saved is not None:
                    os.environ["LD_PRELOAD"] = saved
        finally:
            sys.path.remove(root)
            for name in [n for n in sys.modules if n.startswith("torch_memory_saver")]:
                del sys.modules[name]


CHILD = """
import sys
sys.path.insert(0, {module_dir!r})
from cachalloc.memory_saver import torch_memory_saver as t
cdll = t._impl._binary_wrapper.cdll
print(t.retain_cpu_backup, cdll.tms_get_interesting_region(), cdll.tms_get_enable_cpu_backup(),
      cdll.tms_get_cpu_backup_backend().decode(), cdll.tms_get_enable_disk_backup())
"""


def tms_environment(env, tms):
    """TMS's variables, read as TMS reads them (in a fresh process each)."""
    code = CHILD.format(module_dir=sys.argv[1])

    def child(**extra):
        clean = {k: v for k, v in os.environ.items() if not k.startswith("TMS_")}
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**clean, **extra})
        return r.returncode, r.stdout.split(), r.stderr

    rc, out, err = child()
    check(rc == 0 and out == ["False", "False", "False", "pinned", "False"], f"no TMS variable: {out} {err}")
    rc, out, err = child(TMS_RETAIN_CPU_BACKUP="1", TMS_INIT_ENABLE="true", TMS_INIT_ENABLE_CPU_BACKUP="yes",
                         TMS_INIT_CPU_BACKUP_BACKEND="mmap")
    check(rc == 0 and out == ["True", "True", "True", "mmap", "False"], f"TMS_*: {out} {err}")
    rc, out, err = child(TMS_INIT_ENABLE="1", TMS_INIT_ENABLE_DISK_BACKUP="1")
    check(rc == 0 and out[1] == "True" and out[4] == "True", f"TMS_INIT_ENABLE_DISK_BACKUP: {out} {err}")
    rc, out, err = child(TMS_INIT_ENABLE="maybe")
    check(rc != 0 and "ValueError" in err and "TMS_INIT_ENABLE" in err, f"a value TMS refuses: {err}")
    r = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {sys.argv[1]!r}); import cachalloc"],
                       capture_output=True, text=True, env={**os.environ, "TMS_INIT_ENABLE": "maybe"})
    check(r.returncode == 0, f"importing cachalloc reads no TMS variable: {r.stderr}")
    rc, out, err = child(TMS_INIT_CPU_BACKUP_BACKEND="tape")
    check(rc != 0 and "ValueError" in err, f"an unknown backend: {err}")


def margin(env, tms):
    """memory_margin_bytes: a pausable allocation that would leave less than
    the margin free fails; 0 lifts it (FAKE_CUDA_TOTAL_MB=4096)."""
    tms.memory_margin_bytes = 4000 * MiB
    check(tms.memory_margin_bytes == 4000 * MiB, "the margin reads back")
    with tms.region("margin"):
        check(env.lib.cachalloc_malloc(200 * MiB, 0, None) is None, "refused inside the margin")
    u = env.alloc(200 * MiB)  # untagged: no margin
    tms.memory_margin_bytes = 0
    with tms.region("margin"):
        m = env.alloc(200 * MiB)
    env.free(u, m)


def main():
    sys.path.insert(0, sys.argv[1])
    env = Env()
    from cachalloc.memory_saver import torch_memory_saver as tms
    check(tms.hook_mode == "preload" and tms.enabled, "defaults")
    for step in (regions_and_variants, host_backups, disk_backups, disable_regions, value_errors,
                 subprocess_env, module_mapping, tms_environment, margin):
        step(env, tms)
    check(raises(env.cachalloc.CachallocError, env.cachalloc.set_tag_backup, "big", "tape"), "a bad backup mode")
    print("python_memory_saver: PASS")


main()
