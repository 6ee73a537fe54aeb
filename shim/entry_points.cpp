// entry_points.cpp — the exported driver symbols.
//
// A program linked against libcuda calls these directly (the preload comes
// first in symbol lookup); the dlsym and cuGetProcAddress hooks hand out the
// same functions to programs that look symbols up.  Each wrapper counts its
// entry, and no exception ever crosses into C.
#include "address_ops.h"
#include "capture_tracking.h"
#include "context_ops.h"
#include "context_registry.h"
#include "cuda_api.h"
#include "driver_ops.h"
#include "graph_owners.h"
#include "guarded.h"
#include "ipc_ops.h"
#include "link_imports.h"
#include "process_state.h"
#include "progress_ops.h"
#include "start_up.h"
#include "stream_watch.h"
#include "real_driver.h"

using namespace cachalloc::shim;

#define EXPORT extern "C" __attribute__((visibility("default")))

static const RealDriver* drv() { return real_driver(); }

// The real function, or CUDA_ERROR_NOT_FOUND from the enclosing lambda when
// the driver lacks it (only reachable by a program linked against a libcuda
// that does not have the symbol it calls).
#define CACHALLOC_REAL_OR_FAIL(fn)                         \
  [[maybe_unused]] const auto real_fn = drv() ? drv()->fn : nullptr; \
  if (real_fn == nullptr) return CUDA_ERROR_NOT_FOUND

// (cuMemAlloc_v2 and cuMemFree_v2 are in driver_ops.cpp, beside the
// functions they inline.)

EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  CACHALLOC_ENTRY(cuMemAllocAsync);
  return guarded([&] { return do_mem_alloc_async(dptr, bytesize, hStream, false); });
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  CACHALLOC_ENTRY(cuMemAllocAsync_ptsz);
  return guarded([&] { return do_mem_alloc_async(dptr, bytesize, hStream, true); });
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  CACHALLOC_ENTRY(cuMemFreeAsync);
  return guarded([&] { return do_mem_free_async(dptr, hStream, false); });
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  CACHALLOC_ENTRY(cuMemFreeAsync_ptsz);
  return guarded([&] { return do_mem_free_async(dptr, hStream, true); });
}

EXPORT CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  CACHALLOC_ENTRY(cuMemGetInfo_v2);
  return guarded([&] { return do_mem_get_info(free, total); });
}

// ---- streams: the free policy needs to know which streams exist ----

EXPORT CUresult cuStreamCreate(CUstream* phStream, unsigned int flags) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuStreamCreate);
    CUresult r = real_fn(phStream, flags);
    if (r == CUDA_SUCCESS) note_stream_created(*phStream, flags);
    return r;
  });
}

EXPORT CUresult cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags, int priority) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuStreamCreateWithPriority);
    CUresult r = real_fn(phStream, flags, priority);
    if (r == CUDA_SUCCESS) note_stream_created(*phStream, flags);
    return r;
  });
}

EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuStreamDestroy_v2);
    // Before the real destroy: no event may be recorded on a dead stream.
    note_stream_destroying(hStream);
    return real_fn(hStream);
  });
}

// ---- the program's own waits: device progress for cross-stream reuse
// (progress_ops.h); the per-thread stream noted as every watched call
// notes it (stream_watch.h) ----

EXPORT CUresult cuStreamSynchronize(CUstream hStream) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuStreamSynchronize);
    if (hStream == CU_STREAM_PER_THREAD) note_per_thread_stream();
    return synchronize_stream(hStream, false, real_fn);
  });
}

EXPORT CUresult cuStreamSynchronize_ptsz(CUstream hStream) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuStreamSynchronize_ptsz);
    if (hStream == nullptr || hStream == CU_STREAM_PER_THREAD) note_per_thread_stream();
    return synchronize_stream(hStream, true, real_fn);
  });
}

EXPORT CUresult cuCtxSynchronize(void) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuCtxSynchronize);
    return synchronize_context(nullptr, [](CUcontext) { return drv()->cuCtxSynchronize(); });
  });
}

EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuCtxSynchronize_v2);
    return synchronize_context(ctx, real_fn);
  });
}

// ---- capture: counted so that the allocation path asks the driver only
// while some capture is in flight (capture_tracking.h) ----

// What a capture's begin and end tell the owner tokens (graph_owners.h) and
// the capture's context (its stream order, context_registry.h).
static constexpr CaptureListeners kCaptureListeners{
    open_capture_token,
    close_capture_token,
    [](CUcontext ctx, bool strict_elsewhere) {
      if (ContextState* state = live_state_of(ctx)) state->capture_beginning(strict_elsewhere);
    },
    [](CUcontext ctx) {
      if (ContextState* state = live_state_of(ctx)) state->captures_ended();
    },
};

// Counts the capture before the real begin, under the capture gate, and
// undoes that if the begin fails.
template <typename Begin>
static CUresult begin_counted(CUstream stream, bool ptsz, CUstreamCaptureMode mode, Begin&& begin,
                              CUgraph into = nullptr) {
  std::unique_lock gate(capture_gate());
  capture_began(kCaptureListeners, stream, ptsz, mode, into);
  const CUresult r = begin();
  if (r != CUDA_SUCCESS) capture_abandoned(kCaptureListeners, stream, ptsz);
  return r;
}

// The real end, then the capture is no longer counted; its graph (when the
// end made one) keeps the capture's blocks.
template <typename End>
static CUresult end_counted(CUstream stream, bool ptsz, CUgraph* phGraph, End&& end) {
  const CUresult r = end();
  capture_ended(kCaptureListeners, stream, ptsz, r, r == CUDA_SUCCESS && phGraph != nullptr ? *phGraph : nullptr);
  return r;
}

EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuStreamBeginCapture_v2);
    return begin_counted(hStream, false, mode, [&] { return real_fn(hStream, mode); });
  });
}

EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuStreamBeginCapture_v2_ptsz);
    return begin_counted(hStream, true, mode, [&] { return real_fn(hStream, mode); });
  });
}

EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph, const CUgraphNode* deps,
                                            const CUgraphEdgeData* depData, size_t numDeps, CUstreamCaptureMode mode) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuStreamBeginCaptureToGraph);
    return begin_counted(
        hStream, false, mode, [&] { return real_fn(hStream, hGraph, deps, depData, numDeps, mode); }, hGraph);
  });
}

EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph, const CUgraphNode* deps,
                                                 const CUgraphEdgeData* depData, size_t numDeps,
                                                 CUstreamCaptureMode mode) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuStreamBeginCaptureToGraph_ptsz);
    return begin_counted(
        hStream, true, mode, [&] { return real_fn(hStream, hGraph, deps, depData, numDeps, mode); }, hGraph);
  });
}

EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuStreamEndCapture);
    return end_counted(hStream, false, phGraph, [&] { return real_fn(hStream, phGraph); });
  });
}

EXPORT CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuStreamEndCapture_ptsz);
    return end_counted(hStream, true, phGraph, [&] { return real_fn(hStream, phGraph); });
  });
}

// ---- identity: address ranges and pointer attributes describe the block
// (address_ops.h) ----

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuMemGetAddressRange_v2);
    return do_mem_get_address_range(pbase, psize, dptr);
  });
}

EXPORT CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuPointerGetAttribute);
    return do_pointer_get_attribute(data, attribute, ptr);
  });
}

EXPORT CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute* attributes, void** data,
                                       CUdeviceptr ptr) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuPointerGetAttributes);
    return do_pointer_get_attributes(numAttributes, attributes, data, ptr);
  });
}

EXPORT CUresult cuPointerSetAttribute(const void* value, CUpointer_attribute attribute, CUdeviceptr ptr) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuPointerSetAttribute);
    return do_pointer_set_attribute(value, attribute, ptr);
  });
}

EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuMemRetainAllocationHandle);
    return do_mem_retain_allocation_handle(handle, addr);
  });
}

// The program's own virtual-memory calls, refused on cachalloc's memory.
EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                         unsigned long long flags) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuMemMap);
    return inside_cachalloc_memory(ptr) ? CUDA_ERROR_INVALID_VALUE : real_fn(ptr, size, offset, handle, flags);
  });
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuMemUnmap);
    return inside_cachalloc_memory(ptr) ? CUDA_ERROR_INVALID_VALUE : real_fn(ptr, size);
  });
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuMemSetAccess);
    return inside_cachalloc_memory(ptr) ? CUDA_ERROR_INVALID_VALUE : real_fn(ptr, size, desc, count);
  });
}

EXPORT CUresult cuGreenCtxCreate(CUgreenCtx* phCtx, CUdevResourceDesc desc, CUdevice dev, unsigned int flags) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuGreenCtxCreate);
    const CUresult r = real_fn(phCtx, desc, dev, flags);
    if (r == CUDA_SUCCESS) warn_green_context();
    return r;
  });
}

EXPORT CUresult cuGreenCtxStreamCreate(CUstream* phStream, CUgreenCtx greenCtx, unsigned int flags, int priority) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuGreenCtxStreamCreate);
    const CUresult r = real_fn(phStream, greenCtx, flags, priority);
    if (r == CUDA_SUCCESS) note_green_stream(*phStream);
    return r;
  });
}

// ---- module loads: objects loaded late are read for unseen imports ----
// A program's object that binds driver names at link time (-lcuda) must
// load a module or library before it launches anything: a rare call, so
// the objects loaded since the last look are read here (link_imports.h).

EXPORT CUresult cuModuleLoad(CUmodule* module, const char* fname) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuModuleLoad);
    check_link_imports();
    return real_fn(module, fname);
  });
}

EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuModuleLoadData);
    check_link_imports();
    return real_fn(module, image);
  });
}

EXPORT CUresult cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int numOptions,
                                   CUjit_option* options, void** optionValues) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuModuleLoadDataEx);
    check_link_imports();
    return real_fn(module, image, numOptions, options, optionValues);
  });
}

EXPORT CUresult cuModuleLoadFatBinary(CUmodule* module, const void* fatCubin) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuModuleLoadFatBinary);
    check_link_imports();
    return real_fn(module, fatCubin);
  });
}

EXPORT CUresult cuLibraryLoadData(CUlibrary* library, const void* code, CUjit_option* jitOptions,
                                  void** jitOptionsValues, unsigned int numJitOptions, CUlibraryOption* libraryOptions,
                                  void** libraryOptionValues, unsigned int numLibraryOptions) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuLibraryLoadData);
    check_link_imports();
    return real_fn(library, code, jitOptions, jitOptionsValues, numJitOptions, libraryOptions, libraryOptionValues,
                   numLibraryOptions);
  });
}

EXPORT CUresult cuLibraryLoadFromFile(CUlibrary* library, const char* fileName, CUjit_option* jitOptions,
                                      void** jitOptionsValues, unsigned int numJitOptions,
                                      CUlibraryOption* libraryOptions, void** libraryOptionValues,
                                      unsigned int numLibraryOptions) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuLibraryLoadFromFile);
    check_link_imports();
    return real_fn(library, fileName, jitOptions, jitOptionsValues, numJitOptions, libraryOptions,
                   libraryOptionValues, numLibraryOptions);
  });
}

// ---- IPC: a handle describes the block (ipc_ops.h) ----

EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuIpcGetMemHandle);
    return do_ipc_get_mem_handle(pHandle, dptr);
  });
}

EXPORT CUresult cuMemGetHandleForAddressRange(void* handle, CUdeviceptr dptr, size_t size, CUmemRangeHandleType type,
                                              unsigned long long flags) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuMemGetHandleForAddressRange);
    return do_get_handle_for_address_range(handle, dptr, size, type, flags);
  });
}

// ---- memory pools: once the program configures one, cuMemAllocAsync
// goes to the driver (driver_ops.h) ----

EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuDeviceSetMemPool);
    CUresult r = real_fn(dev, pool);
    if (r == CUDA_SUCCESS) note_pools_configured("cuDeviceSetMemPool");
    return r;
  });
}

EXPORT CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc* map, size_t count) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuMemPoolSetAccess);
    CUresult r = real_fn(pool, map, count);
    if (r == CUDA_SUCCESS) note_pools_configured("cuMemPoolSetAccess");
    return r;
  });
}

// ---- context lifetime and peer access (context_ops.h) ----

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuCtxDestroy_v2);
    return do_ctx_destroy(ctx, real_fn);
  });
}

EXPORT CUresult cuCtxDestroy(CUcontext ctx) {
  return guarded([&] { return do_ctx_destroy(ctx, drv() ? drv()->cuCtxDestroy : nullptr); });
}

EXPORT CUresult cuCtxDetach(CUcontext ctx) {
  return guarded([&] { return do_ctx_destroy(ctx, drv() ? drv()->cuCtxDetach : nullptr); });
}

EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  return guarded([&] { return do_primary_ctx_reset(dev, true); });
}

EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  return guarded([&] { return do_primary_ctx_reset(dev, false); });
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  return guarded([&] { return do_primary_ctx_release(dev, true); });
}

EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  return guarded([&] { return do_primary_ctx_release(dev, false); });
}

EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuCtxEnablePeerAccess);
    return do_ctx_enable_peer_access(peerContext, Flags);
  });
}

EXPORT CUresult cuCtxDisablePeerAccess(CUcontext peerContext) {
  return guarded([&] {
    CACHALLOC_REAL_OR_FAIL(cuCtxDisablePeerAccess);
    return do_ctx_disable_peer_access(peerContext);
  });
}
