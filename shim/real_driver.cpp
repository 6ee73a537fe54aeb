// real_driver.cpp — opens libcuda.so.1 lazily and resolves the real functions.
#include "real_driver.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>

namespace cachalloc::shim {
namespace {

template <typename Fn>
void resolve(void* handle, Fn* slot, const char* name) {
  *slot = reinterpret_cast<Fn>(real_dlsym(handle, name));
}

void resolve_all(RealDriver* d) {
  void* h = d->handle;
  resolve(h, &d->get_proc_address_v2, "cuGetProcAddress_v2");
  resolve(h, &d->get_proc_address_v1, "cuGetProcAddress");
  resolve(h, &d->cuMemAlloc_v2, "cuMemAlloc_v2");
  resolve(h, &d->cuMemFree_v2, "cuMemFree_v2");
  resolve(h, &d->cuMemGetInfo_v2, "cuMemGetInfo_v2");
  resolve(h, &d->cuMemAllocAsync, "cuMemAllocAsync");
  resolve(h, &d->cuMemAllocAsync_ptsz, "cuMemAllocAsync_ptsz");
  resolve(h, &d->cuMemFreeAsync, "cuMemFreeAsync");
  resolve(h, &d->cuMemFreeAsync_ptsz, "cuMemFreeAsync_ptsz");
  resolve(h, &d->cuStreamCreate, "cuStreamCreate");
  resolve(h, &d->cuStreamCreateWithPriority, "cuStreamCreateWithPriority");
  resolve(h, &d->cuStreamDestroy_v2, "cuStreamDestroy_v2");
  resolve(h, &d->cuStreamBeginCapture_v2, "cuStreamBeginCapture_v2");
  resolve(h, &d->cuStreamBeginCapture_v2_ptsz, "cuStreamBeginCapture_v2_ptsz");
  resolve(h, &d->cuStreamBeginCaptureToGraph, "cuStreamBeginCaptureToGraph");
  resolve(h, &d->cuStreamBeginCaptureToGraph_ptsz, "cuStreamBeginCaptureToGraph_ptsz");
  resolve(h, &d->cuStreamEndCapture, "cuStreamEndCapture");
  resolve(h, &d->cuStreamEndCapture_ptsz, "cuStreamEndCapture_ptsz");
  resolve(h, &d->cuStreamIsCapturing, "cuStreamIsCapturing");
  resolve(h, &d->cuThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode");
  resolve(h, &d->graph_instantiate_v1, "cuGraphInstantiate");
  resolve(h, &d->cuGraphInstantiate_v2, "cuGraphInstantiate_v2");
  resolve(h, &d->cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags");
  resolve(h, &d->cuGraphInstantiateWithParams, "cuGraphInstantiateWithParams");
  resolve(h, &d->cuGraphInstantiateWithParams_ptsz, "cuGraphInstantiateWithParams_ptsz");
  resolve(h, &d->cuGraphClone, "cuGraphClone");
  resolve(h, &d->cuGraphAddChildGraphNode, "cuGraphAddChildGraphNode");
  resolve(h, &d->graph_add_node_v1, "cuGraphAddNode");
  resolve(h, &d->cuGraphAddNode_v2, "cuGraphAddNode_v2");
  resolve(h, &d->graph_exec_update_v1, "cuGraphExecUpdate");
  resolve(h, &d->cuGraphExecUpdate_v2, "cuGraphExecUpdate_v2");
  resolve(h, &d->cuGraphExecChildGraphNodeSetParams, "cuGraphExecChildGraphNodeSetParams");
  resolve(h, &d->cuGraphDestroy, "cuGraphDestroy");
  resolve(h, &d->cuGraphExecDestroy, "cuGraphExecDestroy");
  resolve(h, &d->cuMemHostAlloc, "cuMemHostAlloc");
  resolve(h, &d->cuMemAllocHost_v2, "cuMemAllocHost_v2");
  resolve(h, &d->cuMemFreeHost, "cuMemFreeHost");
  resolve(h, &d->cuMemHostGetFlags, "cuMemHostGetFlags");
  resolve(h, &d->cuMemHostGetDevicePointer_v2, "cuMemHostGetDevicePointer_v2");
  resolve(h, &d->cuMemHostRegister_v2, "cuMemHostRegister_v2");
  resolve(h, &d->cuMemHostUnregister, "cuMemHostUnregister");
  resolve(h, &d->cuMemGetAddressRange_v2, "cuMemGetAddressRange_v2");
  resolve(h, &d->cuPointerGetAttribute, "cuPointerGetAttribute");
  resolve(h, &d->cuPointerGetAttributes, "cuPointerGetAttributes");
  resolve(h, &d->cuPointerSetAttribute, "cuPointerSetAttribute");
  resolve(h, &d->cuIpcGetMemHandle, "cuIpcGetMemHandle");
  resolve(h, &d->cuCtxDestroy_v2, "cuCtxDestroy_v2");
  resolve(h, &d->cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset_v2");
  resolve(h, &d->cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset");
  resolve(h, &d->cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease_v2");
  resolve(h, &d->cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease");
  resolve(h, &d->cuDevicePrimaryCtxGetState, "cuDevicePrimaryCtxGetState");
  resolve(h, &d->cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  resolve(h, &d->cuCtxGetId, "cuCtxGetId");
  resolve(h, &d->cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess");
  resolve(h, &d->cuCtxDisablePeerAccess, "cuCtxDisablePeerAccess");
  resolve(h, &d->cuCtxDestroy, "cuCtxDestroy");
  resolve(h, &d->cuCtxDetach, "cuCtxDetach");
  resolve(h, &d->cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle");
  resolve(h, &d->cuMemGetHandleForAddressRange, "cuMemGetHandleForAddressRange");
  resolve(h, &d->cuDeviceSetMemPool, "cuDeviceSetMemPool");
  resolve(h, &d->cuMemPoolSetAccess, "cuMemPoolSetAccess");
  resolve(h, &d->cuStreamGetCtx, "cuStreamGetCtx");
  resolve(h, &d->cuStreamWaitEvent, "cuStreamWaitEvent");
  resolve(h, &d->cuGreenCtxCreate, "cuGreenCtxCreate");
  resolve(h, &d->cuGreenCtxStreamCreate, "cuGreenCtxStreamCreate");
  resolve(h, &d->cuModuleLoad, "cuModuleLoad");
  resolve(h, &d->cuModuleLoadData, "cuModuleLoadData");
  resolve(h, &d->cuModuleLoadDataEx, "cuModuleLoadDataEx");
  resolve(h, &d->cuModuleLoadFatBinary, "cuModuleLoadFatBinary");
  resolve(h, &d->cuLibraryLoadData, "cuLibraryLoadData");
  resolve(h, &d->cuLibraryLoadFromFile, "cuLibraryLoadFromFile");
  resolve(h, &d->cuCtxGetCurrent, "cuCtxGetCurrent");
  resolve(h, &d->cuCtxSetCurrent, "cuCtxSetCurrent");
  resolve(h, &d->cuCtxGetDevice, "cuCtxGetDevice");
  resolve(h, &d->cuCtxSynchronize, "cuCtxSynchronize");
  resolve(h, &d->cuStreamGetFlags, "cuStreamGetFlags");
  resolve(h, &d->cuStreamQuery, "cuStreamQuery");
  resolve(h, &d->cuCtxRecordEvent, "cuCtxRecordEvent");
  resolve(h, &d->cuCtxWaitEvent, "cuCtxWaitEvent");
  resolve(h, &d->cuEventCreate, "cuEventCreate");
  resolve(h, &d->cuEventRecord, "cuEventRecord");
  resolve(h, &d->cuEventQuery, "cuEventQuery");
  resolve(h, &d->cuEventSynchronize, "cuEventSynchronize");
  resolve(h, &d->cuEventDestroy_v2, "cuEventDestroy_v2");
  resolve(h, &d->cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity");
  resolve(h, &d->cuMemAddressReserve, "cuMemAddressReserve");
  resolve(h, &d->cuMemAddressFree, "cuMemAddressFree");
  resolve(h, &d->cuMemCreate, "cuMemCreate");
  resolve(h, &d->cuMemRelease, "cuMemRelease");
  resolve(h, &d->cuMemMap, "cuMemMap");
  resolve(h, &d->cuMemUnmap, "cuMemUnmap");
  resolve(h, &d->cuMemSetAccess, "cuMemSetAccess");
  resolve(h, &d->cuMemcpyDtoHAsync_v2, "cuMemcpyDtoHAsync_v2");
  resolve(h, &d->cuMemcpyHtoDAsync_v2, "cuMemcpyHtoDAsync_v2");
  resolve(h, &d->cuStreamSynchronize, "cuStreamSynchronize");
  resolve(h, &d->cuStreamSynchronize_ptsz, "cuStreamSynchronize_ptsz");
  resolve(h, &d->cuCtxSynchronize_v2, "cuCtxSynchronize_v2");
}

// What the shim cannot work without: the allocation pair, contexts, events.
bool has_essentials(const RealDriver& d) {
  return d.cuMemAlloc_v2 && d.cuMemFree_v2 && d.cuMemGetInfo_v2 && d.cuCtxGetCurrent && d.cuCtxSetCurrent &&
         d.cuCtxGetDevice && d.cuCtxSynchronize && d.cuEventCreate && d.cuEventRecord && d.cuEventQuery &&
         d.cuEventSynchronize && d.cuEventDestroy_v2;
}

using detail::g_driver;
std::once_flag g_once;

void load() {
  void* handle = dlopen("libcuda.so.1", RTLD_LAZY);
  if (handle == nullptr) return;
  static RealDriver table;  // trivially destructible: safe at exit
  table.handle = handle;
  resolve_all(&table);
  if (has_essentials(table)) g_driver.store(&table, std::memory_order_release);
}

}  // namespace

std::atomic<const RealDriver*> detail::g_driver{nullptr};

const RealDriver* detail::load_driver() {
  std::call_once(g_once, load);
  return g_driver.load(std::memory_order_acquire);
}

}  // namespace cachalloc::shim
