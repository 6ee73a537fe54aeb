// load_mode.h — how this copy of libcachalloc.so was loaded, and so whether
// its interception hooks may serve.
//
// Two ways in:
//   * preloaded (LD_PRELOAD, /etc/ld.so.preload) or linked into the program
//     ahead of libc: the exported dlsym, cuGetProcAddress, cuMemAlloc_v2, ...
//     are what the process resolves, and cachalloc serves every allocation
//     (process_state's Mode::active);
//   * dlopen'ed (PyTorch's CUDAPluggableAllocator does ctypes.CDLL(path),
//     i.e. RTLD_LOCAL; python/cachalloc/__init__.py does the same): only
//     the pluggable ABI (shim/pluggable_api.cpp) and the control API are
//     meant to be used.  The hooks must then leave the process's other
//     allocations alone, so the process state becomes Mode::passive (every
//     hook passes to the driver) unless the user asks for interception.
//
// The test is what the process's global scope resolves "dlsym" to: this
// library's own export exactly when it sits in the main link map ahead of
// libc (preloaded or linked), which is exactly when the hooks are reachable.
// A copy dlopen'ed with RTLD_GLOBAL is also behind libc, so it stays passive.
//
// CACHALLOC_INTERCEPT overrides the test: 1/on/true/yes turns interception on
// (e.g. a copy dlopen'ed with RTLD_GLOBAL whose exports the program does
// reach), 0/off/false/no turns it off (a preloaded copy then serves only the
// pluggable ABI and the control API); anything else, or unset, is "auto".
#pragma once

namespace cachalloc::shim {

// Whether the hooks should serve (see above).  Reads the environment and the
// loader's state once; never loads libcuda.
bool interception_wanted();

// The same symbol of another copy of libcachalloc.so that the process's
// global scope resolves first (a preloaded copy when this one was dlopen'ed
// from another path), or nullptr when the global scope resolves `name` to
// this copy or to nothing.  The pluggable entry points forward to it, so
// that one allocator state serves the process.
void* other_copy_symbol(const char* name);

}  // namespace cachalloc::shim
