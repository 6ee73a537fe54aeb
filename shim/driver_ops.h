// driver_ops.h — the semantics behind every allocation entry point.
//
// entry_points.cpp and runtime_entry_points.cpp are a few lines each; the
// decisions live here: serve from the context's cache, pass to the real
// driver (not serving, capture, foreign pointer, no context), or refuse
// (double free, interior pointer).  Return values are the driver's CUresult.
#pragma once

#include "context_registry.h"
#include "cuda_api.h"

namespace cachalloc::shim {

CUresult do_mem_alloc_async(CUdeviceptr* out, size_t size, CUstream stream, bool ptsz);
CUresult do_mem_free_async(CUdeviceptr ptr, CUstream stream, bool ptsz);
CUresult do_mem_get_info(size_t* free_bytes, size_t* total_bytes);

// The runtime hooks hand a failed cudaMalloc to cudart so that cudart's
// error state stays exact; cudart then calls cuMemAlloc_v2 for the same
// request.  While this guard lives, that call fails at once with
// CUDA_ERROR_OUT_OF_MEMORY instead of running the cache's retry path (and
// its OOM report) a second time.
class RepeatOomGuard {
 public:
  RepeatOomGuard();
  ~RepeatOomGuard();
  RepeatOomGuard(const RepeatOomGuard&) = delete;
  RepeatOomGuard& operator=(const RepeatOomGuard&) = delete;
};

// Whether cuMemAllocAsync on `stream` may be served from `ctx`'s cache.
// Not when the program configured a memory pool (cuDeviceSetMemPool,
// cuMemPoolSetAccess: it wants the pool's access, IPC and limits, which a
// cachalloc block lacks), and not for a stream of another context: the
// driver allocates on the stream's device, not the current one.
bool serve_async_on(const ContextState& ctx, CUstream stream, bool ptsz);
// After a successful call that configures a memory pool.
void note_pools_configured(const char* call);

// Stream bookkeeping: after a successful create, before the real destroy.
void note_stream_created(CUstream stream, unsigned int flags);
void note_stream_destroying(CUstream stream);

}  // namespace cachalloc::shim
