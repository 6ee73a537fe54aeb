"""cachalloc.torch_companion — a small library built against the installed
PyTorch, so that an out-of-memory through the pluggable allocator raises
torch.OutOfMemoryError (docs/PYTORCH.md).

PyTorch's CUDAPluggableAllocator does not check what its malloc function
returns: a NULL from cachalloc_malloc would become a tensor at address 0.
Only C++ code built against c10 can throw c10::OutOfMemoryError, which
PyTorch turns into torch.OutOfMemoryError.  So the first use_with_torch()
compiles this source (about 20 lines; a few seconds, once per PyTorch and
cachalloc version, into ~/.cache/cachalloc or $CACHALLOC_CACHE_DIR) with
the C++ compiler PyTorch's extensions use, and the allocator PyTorch gets
calls cachalloc_torch_malloc / cachalloc_torch_free, which forward to the
library.  If it cannot be built (no compiler, no headers), a warning says
so and cachalloc_malloc is used directly, as before.

The graph-pool hooks need no compiling: PyTorch's setters take function
pointers of C++ types, which libcachalloc.so exports (shim/graph_pools.h).
"""

import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings

SOURCE = r"""
// Built by cachalloc.torch_companion against the installed PyTorch.
// No iostream here (no c10::str, no TORCH_CHECK's message building): the
// messages are formatted with snprintf.  A companion whose compiler's
// libstdc++ differs from PyTorch's can carry its own copy of the stream
// code, whose locale facets are not the process's: formatting a double
// through it crashed PyTorch 2.11 (H200, 2026-11-27).
#include <c10/util/Exception.h>
#include <dlfcn.h>
#include <sys/types.h>
#include <cstdio>
#include <string>

namespace {
using Malloc = void* (*)(ssize_t, int, void*);
using Free = void (*)(void*, ssize_t, int, void*);
Malloc g_malloc = nullptr;
Free g_free = nullptr;

// The library cachalloc's Python module loaded (ctypes: RTLD_LOCAL).
struct Bind {
  Bind() {
    void* h = dlopen(CACHALLOC_LIBRARY, RTLD_NOW | RTLD_NOLOAD);
    if (h == nullptr) h = dlopen(CACHALLOC_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) return;
    g_malloc = reinterpret_cast<Malloc>(dlsym(h, "cachalloc_malloc"));
    g_free = reinterpret_cast<Free>(dlsym(h, "cachalloc_free"));
  }
} bind;

[[noreturn]] void throw_unloaded() {
  throw c10::Error(c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                   std::string("cachalloc: ") + CACHALLOC_LIBRARY + " could not be loaded");
}

[[noreturn]] void throw_out_of_memory(ssize_t size, int device) {
  char msg[512];
  std::snprintf(msg, sizeof msg,
                "CUDA out of memory. Tried to allocate %.2f MiB on device %d through cachalloc's pluggable "
                "allocator. cachalloc's report on stderr says why (what the device holds, what cachalloc "
                "caches, which setting would help).",
                static_cast<double>(size) / (1 << 20), device);
  throw c10::OutOfMemoryError(c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                              std::string(msg));
}
}  // namespace

extern "C" __attribute__((visibility("default"))) void* cachalloc_torch_malloc(ssize_t size, int device,
                                                                               void* stream) {
  if (g_malloc == nullptr) throw_unloaded();
  void* p = g_malloc(size, device, stream);
  if (p == nullptr && size > 0) throw_out_of_memory(size, device);
  return p;
}

extern "C" __attribute__((visibility("default"))) void cachalloc_torch_free(void* ptr, ssize_t size, int device,
                                                                            void* stream) {
  if (g_free != nullptr) g_free(ptr, size, device, stream);
}
"""

_failed = {}  # library path -> why the build failed (warned once)


def _cache_dir():
    base = os.environ.get("CACHALLOC_CACHE_DIR")
    if not base:
        base = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cachalloc")
    return base


def _build(torch, library, target):
    from torch.utils import cpp_extension

    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise RuntimeError("no C++ compiler (c++ or g++ on PATH, or CXX)")
    includes = [f"-I{d}" for d in cpp_extension.include_paths()]
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(target)) as tmp:
        src = os.path.join(tmp, "companion.cpp")
        with open(src, "w") as f:
            f.write(SOURCE)
        out = os.path.join(tmp, "companion.so")
        cmd = [compiler, "-std=c++17", "-O2", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
               f'-DCACHALLOC_LIBRARY="{library}"', *includes, src, "-o", out, f"-L{torch_lib}", "-lc10",
               f"-Wl,-rpath,{torch_lib}", "-ldl"]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{run.stderr[-2000:]}")
        os.replace(out, target)  # atomic: another process may build the same


def companion_path(library):
    """The companion library for `library` (libcachalloc.so's path), built
    if needed; None (with a warning, once) when it cannot be built."""
    library = os.path.realpath(library)
    if library in _failed:
        return None
    try:
        import torch

        key = hashlib.sha256("\0".join([SOURCE, library, torch.__version__, torch.__file__]).encode()).hexdigest()[:16]
        target = os.path.join(_cache_dir(), f"torch_companion-{key}.so")
        if not os.path.exists(target):
            _build(torch, library, target)
        return target
    except Exception as e:  # noqa: BLE001 — any failure means: go without it
        _failed[library] = str(e)
        warnings.warn(f"cachalloc: the PyTorch companion could not be built ({e}); an out-of-memory will hand "
                      "PyTorch a NULL pointer instead of raising torch.OutOfMemoryError", RuntimeWarning,
                      stacklevel=3)
        return None
