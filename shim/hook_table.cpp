// hook_table.cpp — the two lookup tables.
#include "hook_table.h"

#include <cstring>

#include "graph_entry_points.h"
#include "stream_watch.h"

// cuCtxDetach is deprecated, but programs may still call it: it is hooked
// because it destroys a context.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace cachalloc::shim {
namespace {

#define W(fn) reinterpret_cast<void*>(&::fn)

struct ByName {
  const char* name;
  void* wrapper;
};

const ByName kByName[] = {
    {"cuGetProcAddress", W(cuGetProcAddress)},
    {"cuGetProcAddress_v2", W(cuGetProcAddress_v2)},
    {"cuMemAlloc_v2", W(cuMemAlloc_v2)},
    {"cuMemFree_v2", W(cuMemFree_v2)},
    {"cuMemGetInfo_v2", W(cuMemGetInfo_v2)},
    {"cuMemAllocAsync", W(cuMemAllocAsync)},
    {"cuMemAllocAsync_ptsz", W(cuMemAllocAsync_ptsz)},
    {"cuMemFreeAsync", W(cuMemFreeAsync)},
    {"cuMemFreeAsync_ptsz", W(cuMemFreeAsync_ptsz)},
    {"cuStreamCreate", W(cuStreamCreate)},
    {"cuStreamCreateWithPriority", W(cuStreamCreateWithPriority)},
    {"cuStreamDestroy_v2", W(cuStreamDestroy_v2)},
    {"cuStreamSynchronize", W(cuStreamSynchronize)},
    {"cuStreamSynchronize_ptsz", W(cuStreamSynchronize_ptsz)},
    {"cuCtxSynchronize", W(cuCtxSynchronize)},
    {"cuCtxSynchronize_v2", W(cuCtxSynchronize_v2)},
    {"cuStreamBeginCapture_v2", W(cuStreamBeginCapture_v2)},
    {"cuStreamBeginCapture_v2_ptsz", W(cuStreamBeginCapture_v2_ptsz)},
    {"cuStreamBeginCaptureToGraph", W(cuStreamBeginCaptureToGraph)},
    {"cuStreamBeginCaptureToGraph_ptsz", W(cuStreamBeginCaptureToGraph_ptsz)},
    {"cuStreamEndCapture", W(cuStreamEndCapture)},
    {"cuStreamEndCapture_ptsz", W(cuStreamEndCapture_ptsz)},
    {"cuMemGetAddressRange_v2", W(cuMemGetAddressRange_v2)},
    {"cuPointerGetAttribute", W(cuPointerGetAttribute)},
    {"cuPointerGetAttributes", W(cuPointerGetAttributes)},
    {"cuPointerSetAttribute", W(cuPointerSetAttribute)},
    {"cuIpcGetMemHandle", W(cuIpcGetMemHandle)},
    {"cuCtxDestroy_v2", W(cuCtxDestroy_v2)},
    {"cuDevicePrimaryCtxReset_v2", W(cuDevicePrimaryCtxReset_v2)},
    {"cuDevicePrimaryCtxReset", W(cuDevicePrimaryCtxReset)},
    {"cuDevicePrimaryCtxRelease_v2", W(cuDevicePrimaryCtxRelease_v2)},
    {"cuDevicePrimaryCtxRelease", W(cuDevicePrimaryCtxRelease)},
    {"cuCtxEnablePeerAccess", W(cuCtxEnablePeerAccess)},
    {"cuCtxDisablePeerAccess", W(cuCtxDisablePeerAccess)},
    {"cuCtxDestroy", W(cuCtxDestroy)},
    {"cuCtxDetach", W(cuCtxDetach)},
    {"cuMemRetainAllocationHandle", W(cuMemRetainAllocationHandle)},
    {"cuMemGetHandleForAddressRange", W(cuMemGetHandleForAddressRange)},
    {"cuDeviceSetMemPool", W(cuDeviceSetMemPool)},
    {"cuMemPoolSetAccess", W(cuMemPoolSetAccess)},
    {"cuMemMap", W(cuMemMap)},
    {"cuMemUnmap", W(cuMemUnmap)},
    {"cuMemSetAccess", W(cuMemSetAccess)},
    {"cuGreenCtxCreate", W(cuGreenCtxCreate)},
    {"cuGreenCtxStreamCreate", W(cuGreenCtxStreamCreate)},
    {"cuMemHostAlloc", W(cuMemHostAlloc)},
    {"cuMemAllocHost_v2", W(cuMemAllocHost_v2)},
    {"cuMemFreeHost", W(cuMemFreeHost)},
    {"cuMemHostGetFlags", W(cuMemHostGetFlags)},
    {"cuMemHostGetDevicePointer_v2", W(cuMemHostGetDevicePointer_v2)},
    {"cuGraphInstantiate", W(cachalloc_cuGraphInstantiate_v1)},
    {"cuGraphInstantiate_v2", W(cachalloc_cuGraphInstantiate_v2)},
    {"cuGraphInstantiateWithFlags", W(cachalloc_cuGraphInstantiateWithFlags)},
    {"cuGraphInstantiateWithParams", W(cachalloc_cuGraphInstantiateWithParams)},
    {"cuGraphInstantiateWithParams_ptsz", W(cachalloc_cuGraphInstantiateWithParams_ptsz)},
    {"cuGraphClone", W(cachalloc_cuGraphClone)},
    {"cuGraphAddChildGraphNode", W(cachalloc_cuGraphAddChildGraphNode)},
    {"cuGraphAddNode", W(cachalloc_cuGraphAddNode_v1)},
    {"cuGraphAddNode_v2", W(cachalloc_cuGraphAddNode_v2)},
    {"cuGraphExecUpdate", W(cachalloc_cuGraphExecUpdate_v1)},
    {"cuGraphExecUpdate_v2", W(cachalloc_cuGraphExecUpdate_v2)},
    {"cuGraphExecChildGraphNodeSetParams", W(cachalloc_cuGraphExecChildGraphNodeSetParams)},
    {"cuGraphDestroy", W(cachalloc_cuGraphDestroy)},
    {"cuGraphExecDestroy", W(cachalloc_cuGraphExecDestroy)},
};

// A base name as cuGetProcAddress sees it: the wrapper applies from
// `min_version` on (older versions name an ABI cachalloc does not wrap), with
// a separate wrapper for per-thread-default-stream lookups where one exists.
struct ByBase {
  const char* base;
  int min_version;
  void* wrapper;
  void* wrapper_ptsz;
};

const ByBase kByBase[] = {
    {"cuMemAlloc", 3020, W(cuMemAlloc_v2), nullptr},
    {"cuMemFree", 3020, W(cuMemFree_v2), nullptr},
    {"cuMemGetInfo", 3020, W(cuMemGetInfo_v2), nullptr},
    {"cuMemAllocAsync", 11020, W(cuMemAllocAsync), W(cuMemAllocAsync_ptsz)},
    {"cuMemFreeAsync", 11020, W(cuMemFreeAsync), W(cuMemFreeAsync_ptsz)},
    {"cuStreamCreate", 0, W(cuStreamCreate), nullptr},
    {"cuStreamCreateWithPriority", 0, W(cuStreamCreateWithPriority), nullptr},
    {"cuStreamDestroy", 4000, W(cuStreamDestroy_v2), nullptr},
    {"cuStreamSynchronize", 2000, W(cuStreamSynchronize), W(cuStreamSynchronize_ptsz)},
    {"cuCtxSynchronize", 13000, W(cuCtxSynchronize_v2), nullptr},
    {"cuCtxSynchronize", 2000, W(cuCtxSynchronize), nullptr},
    {"cuStreamBeginCapture", 10010, W(cuStreamBeginCapture_v2), W(cuStreamBeginCapture_v2_ptsz)},
    {"cuStreamBeginCaptureToGraph", 12030, W(cuStreamBeginCaptureToGraph), W(cuStreamBeginCaptureToGraph_ptsz)},
    {"cuStreamEndCapture", 0, W(cuStreamEndCapture), W(cuStreamEndCapture_ptsz)},
    {"cuMemGetAddressRange", 3020, W(cuMemGetAddressRange_v2), nullptr},
    {"cuPointerGetAttribute", 4000, W(cuPointerGetAttribute), nullptr},
    {"cuPointerGetAttributes", 7000, W(cuPointerGetAttributes), nullptr},
    {"cuPointerSetAttribute", 6000, W(cuPointerSetAttribute), nullptr},
    {"cuIpcGetMemHandle", 4010, W(cuIpcGetMemHandle), nullptr},
    {"cuCtxDestroy", 4000, W(cuCtxDestroy_v2), nullptr},
    {"cuCtxDestroy", 2000, W(cuCtxDestroy), nullptr},
    {"cuCtxDetach", 2000, W(cuCtxDetach), nullptr},
    {"cuMemRetainAllocationHandle", 11000, W(cuMemRetainAllocationHandle), nullptr},
    {"cuMemGetHandleForAddressRange", 11070, W(cuMemGetHandleForAddressRange), nullptr},
    {"cuDeviceSetMemPool", 11020, W(cuDeviceSetMemPool), nullptr},
    {"cuMemPoolSetAccess", 11020, W(cuMemPoolSetAccess), nullptr},
    {"cuMemMap", 10020, W(cuMemMap), nullptr},
    {"cuMemUnmap", 10020, W(cuMemUnmap), nullptr},
    {"cuMemSetAccess", 10020, W(cuMemSetAccess), nullptr},
    {"cuGreenCtxCreate", 12040, W(cuGreenCtxCreate), nullptr},
    {"cuGreenCtxStreamCreate", 12050, W(cuGreenCtxStreamCreate), nullptr},
    {"cuMemHostAlloc", 2020, W(cuMemHostAlloc), nullptr},
    {"cuMemAllocHost", 3020, W(cuMemAllocHost_v2), nullptr},
    {"cuMemFreeHost", 2000, W(cuMemFreeHost), nullptr},
    {"cuMemHostGetFlags", 2030, W(cuMemHostGetFlags), nullptr},
    {"cuMemHostGetDevicePointer", 3020, W(cuMemHostGetDevicePointer_v2), nullptr},
    // The 7.0 and 11.0 entry points of these two differ in name only.
    {"cuDevicePrimaryCtxReset", 11000, W(cuDevicePrimaryCtxReset_v2), nullptr},
    {"cuDevicePrimaryCtxReset", 7000, W(cuDevicePrimaryCtxReset), nullptr},
    {"cuDevicePrimaryCtxRelease", 11000, W(cuDevicePrimaryCtxRelease_v2), nullptr},
    {"cuDevicePrimaryCtxRelease", 7000, W(cuDevicePrimaryCtxRelease), nullptr},
    {"cuCtxEnablePeerAccess", 4000, W(cuCtxEnablePeerAccess), nullptr},
    {"cuCtxDisablePeerAccess", 4000, W(cuCtxDisablePeerAccess), nullptr},
    // Graphs (graph_owners.h).  "cuGraphInstantiate" names three ABIs: from
    // 12.0 on that of cuGraphInstantiateWithFlags (cuda.h maps the name to
    // it), before that two of one 5-argument signature.
    {"cuGraphInstantiate", 12000, W(cachalloc_cuGraphInstantiateWithFlags), nullptr},
    {"cuGraphInstantiate", 11000, W(cachalloc_cuGraphInstantiate_v2), nullptr},
    {"cuGraphInstantiate", 10000, W(cachalloc_cuGraphInstantiate_v1), nullptr},
    {"cuGraphInstantiateWithFlags", 11040, W(cachalloc_cuGraphInstantiateWithFlags), nullptr},
    {"cuGraphInstantiateWithParams", 12000, W(cachalloc_cuGraphInstantiateWithParams),
     W(cachalloc_cuGraphInstantiateWithParams_ptsz)},
    {"cuGraphClone", 10000, W(cachalloc_cuGraphClone), nullptr},
    {"cuGraphAddChildGraphNode", 10000, W(cachalloc_cuGraphAddChildGraphNode), nullptr},
    {"cuGraphAddNode", 12030, W(cachalloc_cuGraphAddNode_v2), nullptr},
    {"cuGraphAddNode", 12020, W(cachalloc_cuGraphAddNode_v1), nullptr},
    {"cuGraphExecUpdate", 12000, W(cachalloc_cuGraphExecUpdate_v2), nullptr},
    {"cuGraphExecUpdate", 10020, W(cachalloc_cuGraphExecUpdate_v1), nullptr},
    {"cuGraphExecChildGraphNodeSetParams", 11010, W(cachalloc_cuGraphExecChildGraphNodeSetParams), nullptr},
    {"cuGraphDestroy", 10000, W(cachalloc_cuGraphDestroy), nullptr},
    {"cuGraphExecDestroy", 10000, W(cachalloc_cuGraphExecDestroy), nullptr},
};

#undef W

}  // namespace

void* wrapper_for_symbol(const char* name, void* sym) {
  for (const ByName& e : kByName)
    if (std::strcmp(e.name, name) == 0) return e.wrapper;
  return watch_wrapper_for_symbol(name, sym);
}

void* wrapper_for_proc(const char* symbol, int cuda_version, cuuint64_t flags) {
  if (std::strcmp(symbol, "cuGetProcAddress") == 0)
    return cuda_version >= 12000 ? reinterpret_cast<void*>(&::cuGetProcAddress_v2)
                                 : reinterpret_cast<void*>(&::cuGetProcAddress);
  const bool ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  // First match wins: a base name listed twice names its newest ABI first.
  for (const ByBase& e : kByBase) {
    if (std::strcmp(e.base, symbol) != 0 || cuda_version < e.min_version) continue;
    return ptsz && e.wrapper_ptsz != nullptr ? e.wrapper_ptsz : e.wrapper;
  }
  return nullptr;
}

}  // namespace cachalloc::shim
