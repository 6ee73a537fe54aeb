// hook_table.h — which looked-up driver symbol gets which cachalloc wrapper.
//
// Two lookup routes reach the table: an explicit-handle dlsym on libcuda
// (exact exported names such as "cuMemAlloc_v2") and cuGetProcAddress
// (base names such as "cuMemAlloc" plus a cudaVersion and flags).  Both
// return nullptr for anything cachalloc does not wrap.
#pragma once

#include "cuda_api.h"

namespace cachalloc::shim {

// What dlsym hands out for driver symbol `name`, whose real address is
// `sym`: a hook, a stream-watching wrapper or thunk (stream_watch.h), or
// nullptr for the driver's own function.
void* wrapper_for_symbol(const char* name, void* sym);

// The wrapper for a cuGetProcAddress lookup: the ABI version the caller asked
// for (cudaVersion >= 3020 is the _v2 ABI of cuMemAlloc/cuMemFree/
// cuMemGetInfo; "cuGetProcAddress" >= 12000 is the 5-argument form) and the
// default-stream variant (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
// -> _ptsz).  nullptr when cachalloc does not wrap that symbol at that version.
void* wrapper_for_proc(const char* symbol, int cuda_version, cuuint64_t flags);

}  // namespace cachalloc::shim
