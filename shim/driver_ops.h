// driver_ops.h — the one place that decides, for every route a device
// allocation or free can take, whether the cache serves it or the call
// passes on.
//
// The routes: the driver's (cuMemAlloc_v2/cuMemFree_v2, exported at the end
// of driver_ops.cpp; cuMemAllocAsync/cuMemFreeAsync, entry_points.cpp), the
// runtime's (cudaMalloc & co., runtime_entry_points.cpp) and PyTorch's
// pluggable ABI (pluggable_api.cpp).  Those files only translate arguments
// and answers; the decisions live here: serve from the context's cache, in
// the context that owns a pointer (made current for the call, never by a
// second pass through the hooks), pass on (not serving, capture, foreign
// pointer, no context), or refuse (double free, interior pointer).  The
// driver route's answers are the driver's CUresult.  Pinned host memory has
// its own room, host_ops.h.
//
// What it may touch: the context registry (whose a pointer is, the current
// context's state) and, through it, each context's CachingAllocator by its
// public calls and its Front's hot halves (core/front.h); the free policy
// (free_policy.h), capture and stream tracking, tags, process state, and
// the real driver only to make an owner current or to pass a call on.
#pragma once

#include "context_registry.h"
#include "cuda_api.h"
#include "process_state.h"

namespace cachalloc::shim {

CUresult do_mem_alloc_async(CUdeviceptr* out, size_t size, CUstream stream, bool ptsz);
CUresult do_mem_free_async(CUdeviceptr ptr, CUstream stream, bool ptsz);
CUresult do_mem_get_info(size_t* free_bytes, size_t* total_bytes);

// Whether `stream` belongs to another context than `ctx` (the default
// streams never do); false while a capture is in flight, when asking the
// driver could break it.
bool stream_of_other_context(const ContextState& ctx, CUstream stream);

// ---- the runtime route (runtime_entry_points.cpp) ----
// The driver route's decisions, with one difference: what the cache does
// not complete goes to cudart's own function instead of the driver, so that
// cudart's error codes and last-error state stay exactly cudart's (cudart
// then reaches the hooked driver call, which refuses or passes as above).
// So does a call without a current context (cudart's lazy initialization
// must run) and one during a graph capture (the hooked call holds or
// refuses as the driver would, capture_owned.h).
enum class RuntimeAnswer {
  served,             // done: cudaSuccess
  pass,               // call cudart's function
  pass_out_of_memory  // the same under RepeatOomGuard: the cache's retry path and OOM report ran already
};
RuntimeAnswer runtime_malloc(void** out, size_t size);
RuntimeAnswer runtime_free(void* ptr);
RuntimeAnswer runtime_malloc_async(void** out, size_t size, CUstream stream, bool ptsz);
RuntimeAnswer runtime_free_async(void* ptr, CUstream stream, bool ptsz);

// ---- the pluggable route (pluggable_api.cpp) ----
// Called with the device's primary context current, the mode caching, no
// capture on `stream` and the ABI's own bookkeeping (graph allocations,
// deferred frees, orphans of a reset) done.
// An allocation for `stream` within the run-time fraction of `device`
// (primary_contexts.h): over it, the cache is emptied and the allocation
// retried once, as PyTorch does.  nullptr when it cannot be served (the
// core wrote the OOM report; an excess over the fraction is logged here).
void* pluggable_malloc(std::size_t size, int device, CUstream stream);
// Frees `ptr` for `stream`: in the current context's cache, else in the
// owner's (made current; passive, its primary is checked against a reset
// first), else with the driver (memory served while cachalloc was
// disabled).  The core's Status (an error: not a live allocation).
Status pluggable_free(void* ptr, CUstream stream, Mode m);

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
