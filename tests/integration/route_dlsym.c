/* route_dlsym.c — reaching the driver as JAX and numba do: plain dlsym on
 * the libcuda handle for each versioned name.  Usage: route_dlsym BEHAVIOUR */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

#include "route_common.h"

static void* h;

static void* get(const char* name) {
  void* fn = dlsym(h, name);
  if (fn == NULL) fprintf(stderr, "dlsym(%s) failed\n", name);
  return fn;
}

static void* entry_by_name(const char* base, int version, int per_thread, const char* exported) {
  (void)base, (void)version, (void)per_thread;
  return get(exported);
}

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    fprintf(stderr, "%s\n", dlerror());
    return 1;
  }
  struct cuda_api api = {
    .init = get("cuInit"),
    .device_get = get("cuDeviceGet"),
    .primary_ctx_retain = get("cuDevicePrimaryCtxRetain"),
    .ctx_set_current = get("cuCtxSetCurrent"),
    .ctx_synchronize = get("cuCtxSynchronize"),
    .stream_create = get("cuStreamCreate"),
    .stream_destroy = get("cuStreamDestroy_v2"),
    .begin_capture = get("cuStreamBeginCapture_v2"),
    .end_capture = get("cuStreamEndCapture"),
    .mem_alloc = get("cuMemAlloc_v2"),
    .mem_free = get("cuMemFree_v2"),
    .mem_alloc_async = get("cuMemAllocAsync"),
    .mem_free_async = get("cuMemFreeAsync"),
    .mem_alloc_async_ptsz = get("cuMemAllocAsync_ptsz"),
    .mem_free_async_ptsz = get("cuMemFreeAsync_ptsz"),
    .mem_get_info = get("cuMemGetInfo_v2"),
    .memset_d8 = get("cuMemsetD8_v2"),
    .memcpy_dtoh = get("cuMemcpyDtoH_v2"),
    .launch_kernel = get("cuLaunchKernel"),
    .launch_kernel_ptsz = get("cuLaunchKernel_ptsz"),
    .event_create = get("cuEventCreate"),
    .event_record = get("cuEventRecord"),
    .event_query = get("cuEventQuery"),
    .host_alloc = get("cuMemHostAlloc"),
    .alloc_host = get("cuMemAllocHost_v2"),
    .free_host = get("cuMemFreeHost"),
    .host_get_flags = get("cuMemHostGetFlags"),
    .host_get_device_pointer = get("cuMemHostGetDevicePointer_v2"),
    .host_register = get("cuMemHostRegister_v2"),
    .host_unregister = get("cuMemHostUnregister"),
    .pointer_get_attribute = get("cuPointerGetAttribute"),
    .pointer_get_attributes = get("cuPointerGetAttributes"),
    .get_address_range = get("cuMemGetAddressRange_v2"),
    .memcpy_htod_async = get("cuMemcpyHtoDAsync_v2"),
    .ctx_destroy = get("cuCtxDestroy_v2"),
    .entry = entry_by_name,
    .fake_stats = (void (*)(struct fake_cuda_stats_t*))get("fake_cuda_stats"),
    .fake_hold = (void (*)(CUstream, int))get("fake_cuda_hold_stream"),
    .fake_on_begin = (void (*)(void (*)(void*), void*))get("fake_cuda_on_begin_capture"),
    .fake_on_mem_alloc = (void (*)(void (*)(void*), void*))get("fake_cuda_on_mem_alloc"),
    .fake_raw = (void* (*)(const char*))get("fake_cuda_lookup_raw"),
    .fake_fail = (void (*)(const char*, int, int, CUresult))get("fake_cuda_fail"),
  };
  return run_behaviour("dlsym", argv[1], &api);
}
