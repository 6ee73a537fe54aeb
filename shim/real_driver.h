// real_driver.h — the real libcuda, opened at first use and never at load time.
//
// Every driver call cachalloc makes goes through this table.  The table is
// filled on the first call of real_driver(): dlopen("libcuda.so.1") (already
// loaded in any process that reaches a hook), then the real dlsym on that
// handle for each versioned symbol, so the shim's own exports are never
// picked up by mistake.  Functions the driver lacks stay null (the VM
// primitives on an old driver, for example); callers check.
#pragma once

#include <atomic>

#include "cuda_api.h"

namespace cachalloc::shim {

struct RealDriver {
  void* handle = nullptr;
  // Driver entry points that lookups are redirected away from.
  PFN_cuGetProcAddress_v12000 get_proc_address_v2 = nullptr;  // cuGetProcAddress_v2
  PFN_cuGetProcAddress_v11030 get_proc_address_v1 = nullptr;  // cuGetProcAddress (4 arguments)
  PFN_cuMemAlloc_v3020 cuMemAlloc_v2 = nullptr;
  PFN_cuMemFree_v3020 cuMemFree_v2 = nullptr;
  PFN_cuMemGetInfo_v3020 cuMemGetInfo_v2 = nullptr;
  PFN_cuMemAllocAsync_v11020 cuMemAllocAsync = nullptr;
  PFN_cuMemAllocAsync_v11020_ptsz cuMemAllocAsync_ptsz = nullptr;
  PFN_cuMemFreeAsync_v11020 cuMemFreeAsync = nullptr;
  PFN_cuMemFreeAsync_v11020_ptsz cuMemFreeAsync_ptsz = nullptr;
  PFN_cuStreamCreate_v2000 cuStreamCreate = nullptr;
  PFN_cuStreamCreateWithPriority_v5050 cuStreamCreateWithPriority = nullptr;
  PFN_cuStreamDestroy_v4000 cuStreamDestroy_v2 = nullptr;
  PFN_cuStreamBeginCapture_v10010 cuStreamBeginCapture_v2 = nullptr;
  PFN_cuStreamBeginCapture_v10010_ptsz cuStreamBeginCapture_v2_ptsz = nullptr;
  PFN_cuStreamBeginCaptureToGraph_v12030 cuStreamBeginCaptureToGraph = nullptr;
  PFN_cuStreamBeginCaptureToGraph_v12030_ptsz cuStreamBeginCaptureToGraph_ptsz = nullptr;
  PFN_cuStreamEndCapture_v10000 cuStreamEndCapture = nullptr;
  PFN_cuStreamEndCapture_v10000_ptsz cuStreamEndCapture_ptsz = nullptr;
  // Page-locked host memory (host_ops.h); optional: without them the
  // host hooks pass through.
  PFN_cuMemHostAlloc_v2020 cuMemHostAlloc = nullptr;
  PFN_cuMemAllocHost_v3020 cuMemAllocHost_v2 = nullptr;
  PFN_cuMemFreeHost_v2000 cuMemFreeHost = nullptr;
  PFN_cuMemHostGetFlags_v2030 cuMemHostGetFlags = nullptr;
  PFN_cuMemHostGetDevicePointer_v3020 cuMemHostGetDevicePointer_v2 = nullptr;
  // Pause backups' host buffers (fresh_pinned.h); optional.
  PFN_cuMemHostRegister_v6050 cuMemHostRegister_v2 = nullptr;
  PFN_cuMemHostUnregister_v4000 cuMemHostUnregister = nullptr;
  // Calls that reveal an allocation (identity, IPC) or end a context.
  PFN_cuMemGetAddressRange_v3020 cuMemGetAddressRange_v2 = nullptr;
  PFN_cuPointerGetAttribute_v4000 cuPointerGetAttribute = nullptr;
  PFN_cuPointerGetAttributes_v7000 cuPointerGetAttributes = nullptr;
  PFN_cuPointerSetAttribute_v6000 cuPointerSetAttribute = nullptr;
  PFN_cuIpcGetMemHandle_v4010 cuIpcGetMemHandle = nullptr;
  PFN_cuCtxDestroy_v4000 cuCtxDestroy_v2 = nullptr;
  PFN_cuDevicePrimaryCtxReset_v11000 cuDevicePrimaryCtxReset_v2 = nullptr;
  PFN_cuDevicePrimaryCtxReset_v11000 cuDevicePrimaryCtxReset = nullptr;  // the 7.0 entry point, same signature
  PFN_cuDevicePrimaryCtxRelease_v11000 cuDevicePrimaryCtxRelease_v2 = nullptr;
  PFN_cuDevicePrimaryCtxRelease_v11000 cuDevicePrimaryCtxRelease = nullptr;  // the 7.0 entry point
  PFN_cuCtxEnablePeerAccess_v4000 cuCtxEnablePeerAccess = nullptr;
  PFN_cuCtxDisablePeerAccess_v4000 cuCtxDisablePeerAccess = nullptr;
  PFN_cuCtxDestroy_v4000 cuCtxDestroy = nullptr;  // before CUDA 4.0, same signature
  PFN_cuCtxDetach_v2000 cuCtxDetach = nullptr;
  PFN_cuMemRetainAllocationHandle_v11000 cuMemRetainAllocationHandle = nullptr;
  PFN_cuMemGetHandleForAddressRange_v11070 cuMemGetHandleForAddressRange = nullptr;
  PFN_cuDeviceSetMemPool_v11020 cuDeviceSetMemPool = nullptr;
  PFN_cuMemPoolSetAccess_v11020 cuMemPoolSetAccess = nullptr;
  PFN_cuGreenCtxCreate_v12040 cuGreenCtxCreate = nullptr;
  PFN_cuGreenCtxStreamCreate_v12050 cuGreenCtxStreamCreate = nullptr;
  // Passed through; a look for unseen imports first (link_imports.h).
  PFN_cuModuleLoad_v2000 cuModuleLoad = nullptr;
  PFN_cuModuleLoadData_v2000 cuModuleLoadData = nullptr;
  PFN_cuModuleLoadDataEx_v2010 cuModuleLoadDataEx = nullptr;
  PFN_cuModuleLoadFatBinary_v2000 cuModuleLoadFatBinary = nullptr;
  PFN_cuLibraryLoadData_v12000 cuLibraryLoadData = nullptr;
  PFN_cuLibraryLoadFromFile_v12000 cuLibraryLoadFromFile = nullptr;
  // Graphs: what keeps a capture's blocks (graph_owners.h); optional.  The
  // oldest ABIs are named graph_*_v1: cuda.h maps their names to the newest.
  PFN_cachalloc_cuGraphInstantiate_v10000 graph_instantiate_v1 = nullptr;     // the 10.0 ABI
  PFN_cachalloc_cuGraphInstantiate_v10000 cuGraphInstantiate_v2 = nullptr;  // the 11.0 ABI, same signature
  PFN_cuGraphInstantiateWithFlags_v11040 cuGraphInstantiateWithFlags = nullptr;
  PFN_cuGraphInstantiateWithParams_v12000 cuGraphInstantiateWithParams = nullptr;
  PFN_cuGraphInstantiateWithParams_v12000_ptsz cuGraphInstantiateWithParams_ptsz = nullptr;
  PFN_cuGraphClone_v10000 cuGraphClone = nullptr;
  PFN_cuGraphAddChildGraphNode_v10000 cuGraphAddChildGraphNode = nullptr;
  PFN_cuGraphAddNode_v12020 graph_add_node_v1 = nullptr;
  PFN_cuGraphAddNode_v12030 cuGraphAddNode_v2 = nullptr;
  PFN_cuGraphExecUpdate_v10020 graph_exec_update_v1 = nullptr;
  PFN_cuGraphExecUpdate_v12000 cuGraphExecUpdate_v2 = nullptr;
  PFN_cuGraphExecChildGraphNodeSetParams_v11010 cuGraphExecChildGraphNodeSetParams = nullptr;
  PFN_cuGraphDestroy_v10000 cuGraphDestroy = nullptr;
  PFN_cuGraphExecDestroy_v10000 cuGraphExecDestroy = nullptr;
  // Used by the shim itself.
  PFN_cuStreamIsCapturing_v10000 cuStreamIsCapturing = nullptr;
  PFN_cuThreadExchangeStreamCaptureMode_v10010 cuThreadExchangeStreamCaptureMode = nullptr;
  PFN_cuStreamGetFlags_v5050 cuStreamGetFlags = nullptr;  // optional
  PFN_cuStreamQuery_v2000 cuStreamQuery = nullptr;        // optional: fences skip idle streams
  PFN_cuStreamGetCtx_v9020 cuStreamGetCtx = nullptr;      // optional
  PFN_cuStreamWaitEvent_v3020 cuStreamWaitEvent = nullptr;  // optional: a new stream waits for earlier work
  PFN_cuCtxGetCurrent_v4000 cuCtxGetCurrent = nullptr;
  PFN_cuCtxSetCurrent_v4000 cuCtxSetCurrent = nullptr;
  PFN_cuCtxGetDevice_v2000 cuCtxGetDevice = nullptr;
  PFN_cuCtxSynchronize_v2000 cuCtxSynchronize = nullptr;
  PFN_cuDevicePrimaryCtxGetState_v7000 cuDevicePrimaryCtxGetState = nullptr;  // optional
  PFN_cuDevicePrimaryCtxRetain_v7000 cuDevicePrimaryCtxRetain = nullptr;      // optional
  PFN_cuCtxGetId_v12000 cuCtxGetId = nullptr;  // optional (CUDA 12.0): the pluggable ABI's reset check
  PFN_cuCtxRecordEvent_v12050 cuCtxRecordEvent = nullptr;  // optional: one event covers the whole context
  PFN_cuCtxWaitEvent_v12050 cuCtxWaitEvent = nullptr;      // optional: all later work of the context waits
  PFN_cuEventCreate_v2000 cuEventCreate = nullptr;
  PFN_cuEventRecord_v2000 cuEventRecord = nullptr;
  PFN_cuEventQuery_v2000 cuEventQuery = nullptr;
  PFN_cuEventSynchronize_v2000 cuEventSynchronize = nullptr;
  PFN_cuEventDestroy_v4000 cuEventDestroy_v2 = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 cuMemGetAllocationGranularity = nullptr;
  PFN_cuMemAddressReserve_v10020 cuMemAddressReserve = nullptr;
  PFN_cuMemAddressFree_v10020 cuMemAddressFree = nullptr;
  PFN_cuMemCreate_v10020 cuMemCreate = nullptr;
  PFN_cuMemRelease_v10020 cuMemRelease = nullptr;
  PFN_cuMemMap_v10020 cuMemMap = nullptr;
  PFN_cuMemUnmap_v10020 cuMemUnmap = nullptr;
  PFN_cuMemSetAccess_v10020 cuMemSetAccess = nullptr;
  // optional: pause backups (core/pause_path.cpp)
  PFN_cuMemcpyDtoHAsync_v3020 cuMemcpyDtoHAsync_v2 = nullptr;
  PFN_cuMemcpyHtoDAsync_v3020 cuMemcpyHtoDAsync_v2 = nullptr;
  PFN_cuStreamSynchronize_v2000 cuStreamSynchronize = nullptr;
  // optional: the program's own waits, hooked (progress_ops.h)
  PFN_cuStreamSynchronize_v7000_ptsz cuStreamSynchronize_ptsz = nullptr;
  PFN_cuCtxSynchronize_v13000 cuCtxSynchronize_v2 = nullptr;
};

// The table, loaded on first call; nullptr when libcuda.so.1 cannot be
// opened or lacks the essentials (then every hook passes through — though a
// hook is only reached once a real libcuda symbol was found).
namespace detail {
extern std::atomic<const RealDriver*> g_driver;
const RealDriver* load_driver();
}  // namespace detail
// (inline: every hook asks, and after the first call it is one load)
[[gnu::always_inline]] inline const RealDriver* real_driver() {
  const RealDriver* d = detail::g_driver.load(std::memory_order_acquire);
  if (d != nullptr) [[likely]] return d;
  return detail::load_driver();
}

// The real dlsym (glibc's), resolved with dlvsym; defined in dlsym_hook.cpp.
void* real_dlsym(void* handle, const char* name);

// The handle of libcuda.so.1 if the process has loaded it, else nullptr.
// Never loads it (RTLD_NOLOAD).
void* loaded_libcuda_handle();

}  // namespace cachalloc::shim
