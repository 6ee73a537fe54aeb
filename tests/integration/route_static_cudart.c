/* route_static_cudart.c — reaching the driver as static cudart does.
 *
 * dlopen("libcuda.so.1"), dlsym(handle, "cuGetProcAddress_v2"), ask it for
 * "cuGetProcAddress" itself (at 12000: the 5-argument form, at 11030: the
 * 4-argument one), then fetch every function through the returned pointer
 * by base name and version, with flags 0 (legacy default stream) and 2
 * (per-thread default stream).  Usage: route_static_cudart BEHAVIOUR */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

#include "route_common.h"

static PFN_cuGetProcAddress_v12000 gpa;

static void* get(const char* name, int version, cuuint64_t flags) {
  void* fn = NULL;
  CUdriverProcAddressQueryResult status;
  if (gpa(name, &fn, version, flags, &status) != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS) {
    fprintf(stderr, "cuGetProcAddress(%s, %d, %llu) failed\n", name, version, (unsigned long long)flags);
    return NULL;
  }
  return fn;
}

static void* entry_by_lookup(const char* base, int version, int per_thread, const char* exported) {
  (void)exported;
  return get(base, version, per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0);
}

/* The lookup functions handed out are cachalloc's, of the right signature. */
static int check_lookups(void* h, PFN_cuGetProcAddress_v12000 entry, PFN_cuGetProcAddress_v11030 old) {
  void* (*raw)(const char*) = (void* (*)(const char*))dlsym(h, "fake_cuda_lookup_raw");
  if (raw == NULL || (void*)entry == raw("cuGetProcAddress_v2") || (void*)gpa == raw("cuGetProcAddress_v2") ||
      (void*)old == raw("cuGetProcAddress") || (void*)old == (void*)gpa) {
    fprintf(stderr, "cuGetProcAddress was not intercepted\n");
    return 0;
  }
  /* The 4-argument form hands out the same wrappers. */
  void* a = NULL;
  void* b = get("cuMemAlloc", 12000, 0);
  if (old("cuMemAlloc", &a, 11030, 0) != CUDA_SUCCESS || a == NULL || a != b) {
    fprintf(stderr, "the 4-argument cuGetProcAddress gave another cuMemAlloc\n");
    return 0;
  }
  /* An old cudaVersion names the v1 ABI, which cachalloc does not wrap. */
  void* v1 = NULL;
  CUdriverProcAddressQueryResult status;
  gpa("cuMemAlloc", &v1, 3000, 0, &status);
  if (v1 == b) {
    fprintf(stderr, "cuMemAlloc at version 3000 was redirected to the _v2 wrapper\n");
    return 0;
  }
  return 1;
}

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    fprintf(stderr, "%s\n", dlerror());
    return 1;
  }
  PFN_cuGetProcAddress_v12000 entry = (PFN_cuGetProcAddress_v12000)dlsym(h, "cuGetProcAddress_v2");
  PFN_cuGetProcAddress_v11030 old = NULL;
  CUdriverProcAddressQueryResult status;
  if (entry == NULL || entry("cuGetProcAddress", (void**)&gpa, 12000, 0, &status) != CUDA_SUCCESS ||
      entry("cuGetProcAddress", (void**)&old, 11030, 0, &status) != CUDA_SUCCESS)
    return 1;
  if (!check_lookups(h, entry, old)) return 1;

  struct cuda_api api = {
    .init = get("cuInit", 12000, 0),
    .device_get = get("cuDeviceGet", 12000, 0),
    .primary_ctx_retain = get("cuDevicePrimaryCtxRetain", 12000, 0),
    .ctx_set_current = get("cuCtxSetCurrent", 12000, 0),
    .ctx_synchronize = get("cuCtxSynchronize", 12000, 0),
    .stream_create = get("cuStreamCreate", 12000, 0),
    .stream_destroy = get("cuStreamDestroy", 12000, 0),
    .begin_capture = get("cuStreamBeginCapture", 12000, 0),
    .end_capture = get("cuStreamEndCapture", 12000, 0),
    .mem_alloc = get("cuMemAlloc", 12000, 0),
    .mem_free = get("cuMemFree", 12000, 0),
    .mem_alloc_async = get("cuMemAllocAsync", 12000, 0),
    .mem_free_async = get("cuMemFreeAsync", 12000, 0),
    .mem_alloc_async_ptsz = get("cuMemAllocAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM),
    .mem_free_async_ptsz = get("cuMemFreeAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM),
    .mem_get_info = get("cuMemGetInfo", 12000, 0),
    .memset_d8 = get("cuMemsetD8", 12000, 0),
    .memcpy_dtoh = get("cuMemcpyDtoH", 12000, 0),
    .launch_kernel = get("cuLaunchKernel", 12000, 0),
    .launch_kernel_ptsz = get("cuLaunchKernel", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM),
    .event_create = get("cuEventCreate", 12000, 0),
    .event_record = get("cuEventRecord", 12000, 0),
    .event_query = get("cuEventQuery", 12000, 0),
    .host_alloc = get("cuMemHostAlloc", 12000, 0),
    .alloc_host = get("cuMemAllocHost", 12000, 0),
    .free_host = get("cuMemFreeHost", 12000, 0),
    .host_get_flags = get("cuMemHostGetFlags", 12000, 0),
    .host_get_device_pointer = get("cuMemHostGetDevicePointer", 12000, 0),
    .host_register = get("cuMemHostRegister", 12000, 0),
    .host_unregister = get("cuMemHostUnregister", 12000, 0),
    .pointer_get_attribute = get("cuPointerGetAttribute", 12000, 0),
    .pointer_get_attributes = get("cuPointerGetAttributes", 12000, 0),
    .get_address_range = get("cuMemGetAddressRange", 12000, 0),
    .memcpy_htod_async = get("cuMemcpyHtoDAsync", 12000, 0),
    .ctx_destroy = get("cuCtxDestroy", 12000, 0),
    .entry = entry_by_lookup,
    .fake_stats = (void (*)(struct fake_cuda_stats_t*))dlsym(h, "fake_cuda_stats"),
    .fake_hold = (void (*)(CUstream, int))dlsym(h, "fake_cuda_hold_stream"),
    .fake_on_begin = (void (*)(void (*)(void*), void*))dlsym(h, "fake_cuda_on_begin_capture"),
    .fake_on_mem_alloc = (void (*)(void (*)(void*), void*))dlsym(h, "fake_cuda_on_mem_alloc"),
    .fake_raw = (void* (*)(const char*))dlsym(h, "fake_cuda_lookup_raw"),
    .fake_fail = (void (*)(const char*, int, int, CUresult))dlsym(h, "fake_cuda_fail"),
  };
  return run_behaviour("static-cudart", argv[1], &api);
}
