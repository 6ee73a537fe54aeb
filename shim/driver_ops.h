// driver_ops.h — the semantics behind every allocation entry point.
//
// entry_points.cpp and runtime_entry_points.cpp are a few lines each; the
// decisions live here: serve from the context's cache, pass to the real
// driver (not serving, capture, foreign pointer, no context), or refuse
// (double free, interior pointer).  Return values are the driver's CUresult.
#pragma once

#include "cuda_api.h"

namespace cachalloc::shim {

CUresult do_mem_alloc(CUdeviceptr* out, size_t size);
CUresult do_mem_free(CUdeviceptr ptr);
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

// Stream bookkeeping: after a successful create, before the real destroy.
void note_stream_created(CUstream stream, unsigned int flags);
void note_stream_destroying(CUstream stream);

}  // namespace cachalloc::shim
