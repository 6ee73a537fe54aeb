/* fake_proc.c — cuGetProcAddress, error names and the test controls.
 *
 * cuGetProcAddress(_v2) resolves base names by version and flags into the
 * fake's own functions (never through dlsym, which the shim hooks).  The
 * test controls (fake_libcuda.h; fault injection is fake_faults.c) have
 * names that do not start with "cu", so the shim's dlsym hook never touches
 * them. */
#include <string.h>

#include "fake_state.h"

/* ---------------- errors ---------------- */

static const struct { CUresult code; const char* name; const char* text; } error_table[] = {
  {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
  {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
  {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
  {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
  {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
  {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
  {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
  {CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
  {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
  {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
  {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
  {CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", "peer access is already enabled"},
  {CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", "peer access has not been enabled"},
  {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
  {CUDA_ERROR_TOO_MANY_PEERS, "CUDA_ERROR_TOO_MANY_PEERS", "peer mapping resources exhausted"},
  {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
  {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static int find_error(CUresult e) {
  for (size_t i = 0; i < sizeof error_table / sizeof error_table[0]; ++i)
    if (error_table[i].code == e) return (int)i;
  return -1;
}
EXPORT CUresult cuGetErrorName(CUresult e, const char** out) {
  int i = find_error(e);
  if (i < 0) return CUDA_ERROR_INVALID_VALUE;
  *out = error_table[i].name;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuGetErrorString(CUresult e, const char** out) {
  int i = find_error(e);
  if (i < 0) return CUDA_ERROR_INVALID_VALUE;
  *out = error_table[i].text;
  return CUDA_SUCCESS;
}

/* ---------------- cuGetProcAddress ---------------- */

EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult* status);
EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags);
/* Entry points the fake defines (in its other files) that cuda.h does not
 * declare under these names. */
CUresult cuDevicePrimaryCtxRelease(CUdevice d);
CUresult cuDevicePrimaryCtxReset(CUdevice d);
CUresult cuCtxCreate_v2(CUcontext* out, unsigned int flags, CUdevice d);
CUresult cuCtxDestroy(CUcontext ctx);
CUresult cuStreamSynchronize_ptsz(CUstream s);
CUresult cuStreamQuery_ptsz(CUstream s);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode m);
CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph* g);
CUresult cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus* out);
CUresult cuEventRecord_ptsz(CUevent e, CUstream s);
CUresult cuStreamWaitEvent_ptsz(CUstream s, CUevent e, unsigned int flags);
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                             unsigned bz, unsigned shmem, CUstream s, void** params, void** extra);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr* out, size_t size, CUstream s);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr ptr, CUstream s);
CUresult cuIpcOpenMemHandle(CUdeviceptr* out, CUipcMemHandle h, unsigned int flags);
/* fake_graphs.c: names cuda.h maps to their newest ABI */
#undef cuGraphInstantiate
#undef cuGraphExecUpdate
#undef cuGraphAddNode
CUresult cuGraphInstantiate(CUgraphExec* out, CUgraph g, CUgraphNode* err, char* log, size_t n);
CUresult cuGraphInstantiate_v2(CUgraphExec* out, CUgraph g, CUgraphNode* err, char* log, size_t n);
CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec* out, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS* p);
CUresult cuGraphExecUpdate(CUgraphExec e, CUgraph g, CUgraphNode* err, CUgraphExecUpdateResult* res);
CUresult cuGraphAddNode(CUgraphNode* node, CUgraph parent, const CUgraphNode* deps, size_t n, CUgraphNodeParams* p);
/* fake_more_work.c */
CUresult cuMemcpyAtoD_v2_ptds(CUdeviceptr dst, CUarray src, size_t off, size_t n);
CUresult cuMemcpyDtoA_v2_ptds(CUarray dst, size_t off, CUdeviceptr src, size_t n);
CUresult cuMemcpyBatchAsync_ptsz(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes, size_t count,
                                 CUmemcpyAttributes* attrs, size_t* attr_idxs, size_t nattrs, size_t* fail_idx,
                                 CUstream s);
CUresult cuMemcpyBatchAsync_v2_ptsz(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes, size_t count,
                                    CUmemcpyAttributes* attrs, size_t* attr_idxs, size_t nattrs, CUstream s);
CUresult cuStreamWaitValue32_v2_ptsz(CUstream s, CUdeviceptr addr, cuuint32_t value, unsigned int flags);
CUresult cuMemBatchDecompressAsync_ptsz(CUmemDecompressParams* params, size_t count, unsigned int flags,
                                        size_t* error_index, CUstream s);
CUresult cuFutureWork_ptsz(void* a, int b, size_t c, void* d, unsigned e, CUstream s);
CUresult cuFutureWork(void* a, int b, size_t c, void* d, unsigned e, CUstream s);
CUresult cuLaunchKernel_v13050(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shmem, CUstream s, void** params, void** extra,
                               unsigned long long tag);
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* cuCtxDetach: old, still callable */

/* Base name -> implementation, first match wins: an entry applies from
 * `min_version` on, and ptsz entries only to per-thread lookups. */
struct proc_entry { const char* base; int min_version; int ptsz; const char* name; void* fn; };
#define PROC(base, ver, ptsz, fn) {base, ver, ptsz, #fn, (void*)fn}
static const struct proc_entry proc_table[] = {
  PROC("cuGetProcAddress", 12000, 0, cuGetProcAddress_v2),
  PROC("cuGetProcAddress", 11030, 0, cuGetProcAddress),
  PROC("cuInit", 2000, 0, cuInit),
  PROC("cuDriverGetVersion", 2020, 0, cuDriverGetVersion),
  PROC("cuDeviceGet", 2000, 0, cuDeviceGet),
  PROC("cuDeviceGetCount", 2000, 0, cuDeviceGetCount),
  PROC("cuDeviceTotalMem", 3020, 0, cuDeviceTotalMem_v2),
  PROC("cuDeviceGetAttribute", 2000, 0, cuDeviceGetAttribute),
  PROC("cuDevicePrimaryCtxRetain", 7000, 0, cuDevicePrimaryCtxRetain),
  PROC("cuDevicePrimaryCtxRelease", 11000, 0, cuDevicePrimaryCtxRelease_v2),
  PROC("cuDevicePrimaryCtxRelease", 7000, 0, cuDevicePrimaryCtxRelease),
  PROC("cuDevicePrimaryCtxReset", 11000, 0, cuDevicePrimaryCtxReset_v2),
  PROC("cuDevicePrimaryCtxReset", 7000, 0, cuDevicePrimaryCtxReset),
  PROC("cuDevicePrimaryCtxGetState", 7000, 0, cuDevicePrimaryCtxGetState),
  PROC("cuCtxGetCurrent", 4000, 0, cuCtxGetCurrent),
  PROC("cuCtxSetCurrent", 4000, 0, cuCtxSetCurrent),
  PROC("cuCtxGetDevice", 2000, 0, cuCtxGetDevice),
  PROC("cuCtxGetId", 12000, 0, cuCtxGetId),
  PROC("cuCtxSynchronize", 2000, 0, cuCtxSynchronize),
  PROC("cuCtxCreate", 12050, 0, cuCtxCreate_v4),
  PROC("cuCtxCreate", 3020, 0, cuCtxCreate_v2),
  PROC("cuCtxDestroy", 4000, 0, cuCtxDestroy_v2),
  PROC("cuCtxDestroy", 2000, 0, cuCtxDestroy),
  PROC("cuCtxDetach", 2000, 0, cuCtxDetach),
  PROC("cuStreamGetCtx", 9020, 0, cuStreamGetCtx),
  PROC("cuGreenCtxCreate", 12040, 0, cuGreenCtxCreate),
  PROC("cuGreenCtxStreamCreate", 12050, 0, cuGreenCtxStreamCreate),
  PROC("cuMemRetainAllocationHandle", 11000, 0, cuMemRetainAllocationHandle),
  PROC("cuDeviceGetDefaultMemPool", 11020, 0, cuDeviceGetDefaultMemPool),
  PROC("cuDeviceSetMemPool", 11020, 0, cuDeviceSetMemPool),
  PROC("cuMemPoolSetAccess", 11020, 0, cuMemPoolSetAccess),
  PROC("cuMemGetHandleForAddressRange", 11070, 0, cuMemGetHandleForAddressRange),
  PROC("cuCtxEnablePeerAccess", 4000, 0, cuCtxEnablePeerAccess),
  PROC("cuCtxDisablePeerAccess", 4000, 0, cuCtxDisablePeerAccess),
  PROC("cuStreamCreate", 2000, 0, cuStreamCreate),
  PROC("cuStreamCreateWithPriority", 5050, 0, cuStreamCreateWithPriority),
  PROC("cuStreamDestroy", 4000, 0, cuStreamDestroy_v2),
  PROC("cuStreamSynchronize", 7000, 1, cuStreamSynchronize_ptsz),
  PROC("cuStreamSynchronize", 2000, 0, cuStreamSynchronize),
  PROC("cuStreamQuery", 7000, 1, cuStreamQuery_ptsz),
  PROC("cuStreamQuery", 2000, 0, cuStreamQuery),
  PROC("cuStreamBeginCapture", 10010, 1, cuStreamBeginCapture_v2_ptsz),
  PROC("cuStreamBeginCapture", 10010, 0, cuStreamBeginCapture_v2),
  PROC("cuStreamEndCapture", 10000, 1, cuStreamEndCapture_ptsz),
  PROC("cuStreamEndCapture", 10000, 0, cuStreamEndCapture),
  PROC("cuStreamIsCapturing", 10000, 1, cuStreamIsCapturing_ptsz),
  PROC("cuStreamIsCapturing", 10000, 0, cuStreamIsCapturing),
  PROC("cuEventCreate", 2000, 0, cuEventCreate),
  PROC("cuEventRecord", 7000, 1, cuEventRecord_ptsz),
  PROC("cuEventRecord", 2000, 0, cuEventRecord),
  PROC("cuStreamWaitEvent", 7000, 1, cuStreamWaitEvent_ptsz),
  PROC("cuStreamWaitEvent", 3020, 0, cuStreamWaitEvent),
  PROC("cuLaunchKernel", 7000, 1, cuLaunchKernel_ptsz),
  PROC("cuLaunchKernel", 13050, 0, cuLaunchKernel_v13050),
  PROC("cuLaunchKernel", 4000, 0, cuLaunchKernel),
  PROC("cuCtxRecordEvent", 12050, 0, cuCtxRecordEvent),
  PROC("cuCtxWaitEvent", 12050, 0, cuCtxWaitEvent),
  PROC("cuEventQuery", 2000, 0, cuEventQuery),
  PROC("cuEventSynchronize", 2000, 0, cuEventSynchronize),
  PROC("cuEventDestroy", 4000, 0, cuEventDestroy_v2),
  PROC("cuMemAlloc", 3020, 0, cuMemAlloc_v2),
  PROC("cuMemFree", 3020, 0, cuMemFree_v2),
  PROC("cuMemGetInfo", 3020, 0, cuMemGetInfo_v2),
  PROC("cuMemGetAddressRange", 3020, 0, cuMemGetAddressRange_v2),
  PROC("cuMemAllocAsync", 11020, 1, cuMemAllocAsync_ptsz),
  PROC("cuMemAllocAsync", 11020, 0, cuMemAllocAsync),
  PROC("cuMemFreeAsync", 11020, 1, cuMemFreeAsync_ptsz),
  PROC("cuMemFreeAsync", 11020, 0, cuMemFreeAsync),
  PROC("cuPointerGetAttribute", 4000, 0, cuPointerGetAttribute),
  PROC("cuPointerGetAttributes", 7000, 0, cuPointerGetAttributes),
  PROC("cuPointerSetAttribute", 6000, 0, cuPointerSetAttribute),
  PROC("cuIpcGetMemHandle", 4010, 0, cuIpcGetMemHandle),
  PROC("cuIpcOpenMemHandle", 11000, 0, cuIpcOpenMemHandle_v2),
  PROC("cuIpcOpenMemHandle", 4010, 0, cuIpcOpenMemHandle),
  PROC("cuIpcCloseMemHandle", 4010, 0, cuIpcCloseMemHandle),
  PROC("cuMemGetAllocationGranularity", 10020, 0, cuMemGetAllocationGranularity),
  PROC("cuMemAddressReserve", 10020, 0, cuMemAddressReserve),
  PROC("cuMemAddressFree", 10020, 0, cuMemAddressFree),
  PROC("cuMemCreate", 10020, 0, cuMemCreate),
  PROC("cuMemRelease", 10020, 0, cuMemRelease),
  PROC("cuMemMap", 10020, 0, cuMemMap),
  PROC("cuMemUnmap", 10020, 0, cuMemUnmap),
  PROC("cuMemSetAccess", 10020, 0, cuMemSetAccess),
  PROC("cuMemHostAlloc", 2020, 0, cuMemHostAlloc),
  PROC("cuMemAllocHost", 3020, 0, cuMemAllocHost_v2),
  PROC("cuMemFreeHost", 2000, 0, cuMemFreeHost),
  PROC("cuMemHostGetFlags", 2030, 0, cuMemHostGetFlags),
  PROC("cuMemHostGetDevicePointer", 3020, 0, cuMemHostGetDevicePointer_v2),
  PROC("cuMemHostRegister", 6050, 0, cuMemHostRegister_v2),
  PROC("cuMemHostUnregister", 4000, 0, cuMemHostUnregister),
  PROC("cuMemcpyHtoD", 3020, 0, cuMemcpyHtoD_v2),
  PROC("cuMemcpyDtoH", 3020, 0, cuMemcpyDtoH_v2),
  PROC("cuMemcpyHtoDAsync", 3020, 0, cuMemcpyHtoDAsync_v2),
  PROC("cuMemcpyDtoHAsync", 3020, 0, cuMemcpyDtoHAsync_v2),
  PROC("cuMemcpyPeer", 4000, 0, cuMemcpyPeer),
  PROC("cuMemsetD8", 3020, 0, cuMemsetD8_v2),
  PROC("cuMemsetD32", 3020, 0, cuMemsetD32_v2),
  PROC("cuMemcpyAtoD", 7000, 1, cuMemcpyAtoD_v2_ptds),
  PROC("cuMemcpyDtoA", 7000, 1, cuMemcpyDtoA_v2_ptds),
  PROC("cuMemcpyBatchAsync", 13000, 1, cuMemcpyBatchAsync_v2_ptsz),
  PROC("cuMemcpyBatchAsync", 12080, 1, cuMemcpyBatchAsync_ptsz),
  PROC("cuStreamWaitValue32", 11070, 1, cuStreamWaitValue32_v2_ptsz),
  PROC("cuMemBatchDecompressAsync", 12060, 1, cuMemBatchDecompressAsync_ptsz),
  PROC("cuLaunchGridAsync", 2000, 0, cuLaunchGridAsync),
  PROC("cuFutureWork", 13050, 1, cuFutureWork_ptsz),
  PROC("cuFutureWork", 13050, 0, cuFutureWork),
  PROC("cuThreadExchangeStreamCaptureMode", 10010, 0, cuThreadExchangeStreamCaptureMode),
  PROC("cuGraphCreate", 10000, 0, cuGraphCreate),
  PROC("cuGraphClone", 10000, 0, cuGraphClone),
  PROC("cuGraphDestroy", 10000, 0, cuGraphDestroy),
  PROC("cuGraphAddChildGraphNode", 10000, 0, cuGraphAddChildGraphNode),
  PROC("cuGraphAddNode", 12030, 0, cuGraphAddNode_v2),
  PROC("cuGraphAddNode", 12020, 0, cuGraphAddNode),
  PROC("cuGraphInstantiate", 12000, 0, cuGraphInstantiateWithFlags),
  PROC("cuGraphInstantiate", 11000, 0, cuGraphInstantiate_v2),
  PROC("cuGraphInstantiate", 10000, 0, cuGraphInstantiate),
  PROC("cuGraphInstantiateWithFlags", 11040, 0, cuGraphInstantiateWithFlags),
  PROC("cuGraphInstantiateWithParams", 12000, 1, cuGraphInstantiateWithParams_ptsz),
  PROC("cuGraphInstantiateWithParams", 12000, 0, cuGraphInstantiateWithParams),
  PROC("cuGraphExecUpdate", 12000, 0, cuGraphExecUpdate_v2),
  PROC("cuGraphExecUpdate", 10020, 0, cuGraphExecUpdate),
  PROC("cuGraphExecChildGraphNodeSetParams", 11010, 0, cuGraphExecChildGraphNodeSetParams),
  PROC("cuGraphExecDestroy", 10000, 0, cuGraphExecDestroy),
  PROC("cuGraphLaunch", 10000, 0, cuGraphLaunch),
  PROC("cuGetErrorName", 6000, 0, cuGetErrorName),
  PROC("cuGetErrorString", 6000, 0, cuGetErrorString),
};
#undef PROC
#define PROC_COUNT (sizeof proc_table / sizeof proc_table[0])

EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult* status) {
  if (symbol == NULL || pfn == NULL) return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  fake.stats.get_proc_address++;
  fake_unlock();
  int ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  int known = 0;
  *pfn = NULL;
  for (size_t i = 0; i < PROC_COUNT; ++i) {
    if (strcmp(proc_table[i].base, symbol) != 0) continue;
    known = 1;
    if (version < proc_table[i].min_version || (proc_table[i].ptsz && !ptsz)) continue;
    *pfn = proc_table[i].fn;
    break;
  }
  if (status)
    *status = *pfn ? CU_GET_PROC_ADDRESS_SUCCESS
                   : known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}

/* ---------------- test controls ---------------- */

/* The leak counters are what the lists hold now (lock held). */
static void count_live(struct fake_cuda_stats_t* s) {
  s->live_events = s->live_streams = s->live_vm_handles = s->live_reservations = s->live_mappings = 0;
  for (struct CUevent_st* e = fake.events; e; e = e->next) s->live_events++;
  for (struct CUstream_st* st = fake.streams; st; st = st->next) s->live_streams++;
  for (struct physical* p = fake.physicals; p; p = p->next) s->live_vm_handles++;
  for (struct reservation* r = fake.reservations; r; r = r->next) s->live_reservations++;
  for (struct vm_mapping* m = fake.mappings; m; m = m->next) s->live_mappings++;
}

EXPORT void fake_cuda_stats(struct fake_cuda_stats_t* out) {
  fake_lock();
  fake_init_once();
  *out = fake.stats;
  count_live(out);
  fake_unlock();
  out->ctx_set_current = __atomic_load_n(&fake_ctx_set_current_calls, __ATOMIC_RELAXED);
}

EXPORT void fake_cuda_hold_stream(CUstream s, int on) {
  fake_lock();
  struct CUstream_st* st = fake_resolve_stream(s, 0);
  if (on) {
    st->held = 1;
  } else if (st->held) {
    st->held = 0;
    st->epoch++;
  }
  fake_unlock();
}

EXPORT void fake_cuda_on_begin_capture(void (*fn)(void*), void* arg) {
  fake_lock();
  fake.on_begin_capture = fn;
  fake.on_begin_capture_arg = arg;
  fake_unlock();
}

EXPORT void fake_cuda_on_mem_alloc(void (*fn)(void*), void* arg) {
  fake_lock();
  fake.on_mem_alloc = fn;
  fake.on_mem_alloc_arg = arg;
  fake_unlock();
}

EXPORT void* fake_cuda_lookup_raw(const char* name) {
  for (size_t i = 0; i < PROC_COUNT; ++i)
    if (strcmp(proc_table[i].name, name) == 0) return proc_table[i].fn;
  return NULL;
}

EXPORT int fake_cuda_vm_access(CUdeviceptr ptr, int device) {
  fake_lock();
  struct vm_mapping* m = fake_find_mapping(ptr);
  int flags = m == NULL ? -1 : device < 0 || device >= MAX_DEVICES ? 0 : (int)fake_vm_flags(m, ptr, device);
  fake_unlock();
  return flags;
}

EXPORT size_t fake_cuda_live_imports(void) {
  size_t n = 0;
  fake_lock();
  for (struct import* m = fake.imports; m; m = m->next) n++;
  fake_unlock();
  return n;
}
