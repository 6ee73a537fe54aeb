/* route_linked.c — a program linked against libcuda (-lcuda): the preload
 * comes first in symbol lookup, so the shim's exports answer the calls.
 * Usage: route_linked BEHAVIOUR */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

#include "route_common.h"

/* cuda.h declares these only for per-thread-default-stream builds. */
CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                             unsigned bz, unsigned shmem, CUstream s, void** params, void** extra);

/* A name the program would bind at link time, resolved as the dynamic
 * linker does (the preloaded library first). */
static void* entry_as_linked(const char* base, int version, int per_thread, const char* exported) {
  (void)base, (void)version, (void)per_thread;
  void* fn = dlsym(RTLD_DEFAULT, exported);
  if (fn == NULL) fprintf(stderr, "%s is not linkable\n", exported);
  return fn;
}

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  struct cuda_api api = {
    .init = cuInit,
    .device_get = cuDeviceGet,
    .primary_ctx_retain = cuDevicePrimaryCtxRetain,
    .ctx_set_current = cuCtxSetCurrent,
    .ctx_synchronize = cuCtxSynchronize,
    .stream_create = cuStreamCreate,
    .stream_destroy = cuStreamDestroy_v2,
    .begin_capture = cuStreamBeginCapture_v2,
    .end_capture = cuStreamEndCapture,
    .mem_alloc = cuMemAlloc_v2,
    .mem_free = cuMemFree_v2,
    .mem_alloc_async = cuMemAllocAsync,
    .mem_free_async = cuMemFreeAsync,
    .mem_alloc_async_ptsz = cuMemAllocAsync_ptsz,
    .mem_free_async_ptsz = cuMemFreeAsync_ptsz,
    .mem_get_info = cuMemGetInfo_v2,
    .memset_d8 = cuMemsetD8_v2,
    .memcpy_dtoh = cuMemcpyDtoH_v2,
    .launch_kernel = cuLaunchKernel,
    .launch_kernel_ptsz = cuLaunchKernel_ptsz,
    .event_create = cuEventCreate,
    .event_record = cuEventRecord,
    .event_query = cuEventQuery,
    .host_alloc = cuMemHostAlloc,
    .alloc_host = cuMemAllocHost_v2,
    .free_host = cuMemFreeHost,
    .host_get_flags = cuMemHostGetFlags,
    .host_get_device_pointer = cuMemHostGetDevicePointer_v2,
    .host_register = cuMemHostRegister_v2,
    .host_unregister = cuMemHostUnregister,
    .pointer_get_attribute = cuPointerGetAttribute,
    .pointer_get_attributes = cuPointerGetAttributes,
    .get_address_range = cuMemGetAddressRange_v2,
    .memcpy_htod_async = cuMemcpyHtoDAsync_v2,
    .ctx_destroy = cuCtxDestroy_v2,
    .entry = entry_as_linked,
    .fake_stats = fake_cuda_stats,
    .fake_hold = fake_cuda_hold_stream,
    .fake_on_begin = fake_cuda_on_begin_capture,
    .fake_on_mem_alloc = fake_cuda_on_mem_alloc,
    .fake_raw = fake_cuda_lookup_raw,
    .fake_fail = fake_cuda_fail,
  };
  return run_behaviour("linked", argv[1], &api);
}
