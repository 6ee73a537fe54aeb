/* fake_libcudart.c — a minimal shared cudart for the shim's runtime tests.
 *
 * Built as tests/fake/libcudart.so.13.  Like the real cudart it reaches the
 * driver by dlopen("libcuda.so.1") + dlsym("cuGetProcAddress_v2") + a lookup
 * of "cuGetProcAddress" itself, initializes lazily (primary context of
 * device 0 made current on first use), maps driver errors to cudaError_t,
 * keeps a per-thread last error, and returns success with NULL for
 * cudaMalloc(p, 0).  fake_cudart_calls() counts the calls that reached it,
 * so a test can tell whether the shim's cudaMalloc answered by itself. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#define EXPORT __attribute__((visibility("default")))

static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct {
  PFN_cuInit_v2000 init;
  PFN_cuDeviceGet_v2000 device_get;
  PFN_cuDevicePrimaryCtxRetain_v7000 retain;
  PFN_cuCtxGetCurrent_v4000 get_current;
  PFN_cuCtxSetCurrent_v4000 set_current;
  PFN_cuMemAlloc_v3020 alloc;
  PFN_cuMemFree_v3020 release;
  PFN_cuMemAllocAsync_v11020 alloc_async;
  PFN_cuMemFreeAsync_v11020 free_async;
  PFN_cuMemAllocAsync_v11020_ptsz alloc_async_ptsz;
  PFN_cuMemFreeAsync_v11020_ptsz free_async_ptsz;
  PFN_cuMemGetInfo_v3020 get_info;
  PFN_cuMemHostAlloc_v2020 host_alloc;
  PFN_cuMemFreeHost_v2000 free_host;
  PFN_cuMemHostGetFlags_v2030 host_get_flags;
} drv;
static int load_ok;
static unsigned long calls;
static __thread cudaError_t last_error;

static void* lookup(PFN_cuGetProcAddress_v12000 gpa, const char* name, cuuint64_t flags) {
  void* fn = NULL;
  CUdriverProcAddressQueryResult status;
  return gpa(name, &fn, 12000, flags, &status) == CUDA_SUCCESS ? fn : NULL;
}

static void load(void) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) return;
  PFN_cuGetProcAddress_v12000 entry = (PFN_cuGetProcAddress_v12000)dlsym(h, "cuGetProcAddress_v2");
  PFN_cuGetProcAddress_v12000 gpa = NULL;
  CUdriverProcAddressQueryResult status;
  if (entry == NULL || entry("cuGetProcAddress", (void**)&gpa, 12000, 0, &status) != CUDA_SUCCESS) return;
  drv.init = lookup(gpa, "cuInit", 0);
  drv.device_get = lookup(gpa, "cuDeviceGet", 0);
  drv.retain = lookup(gpa, "cuDevicePrimaryCtxRetain", 0);
  drv.get_current = lookup(gpa, "cuCtxGetCurrent", 0);
  drv.set_current = lookup(gpa, "cuCtxSetCurrent", 0);
  drv.alloc = lookup(gpa, "cuMemAlloc", 0);
  drv.release = lookup(gpa, "cuMemFree", 0);
  drv.alloc_async = lookup(gpa, "cuMemAllocAsync", 0);
  drv.free_async = lookup(gpa, "cuMemFreeAsync", 0);
  drv.alloc_async_ptsz = lookup(gpa, "cuMemAllocAsync", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
  drv.free_async_ptsz = lookup(gpa, "cuMemFreeAsync", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
  drv.get_info = lookup(gpa, "cuMemGetInfo", 0);
  drv.host_alloc = lookup(gpa, "cuMemHostAlloc", 0);
  drv.free_host = lookup(gpa, "cuMemFreeHost", 0);
  drv.host_get_flags = lookup(gpa, "cuMemHostGetFlags", 0);
  load_ok = drv.init && drv.device_get && drv.retain && drv.get_current && drv.set_current && drv.alloc &&
            drv.release && drv.alloc_async && drv.free_async && drv.alloc_async_ptsz && drv.free_async_ptsz &&
            drv.get_info && drv.host_alloc && drv.free_host && drv.host_get_flags;
}

static cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess) last_error = e;
  return e;
}

static cudaError_t map(CUresult r) {
  switch (r) {
    case CUDA_SUCCESS: return cudaSuccess;
    case CUDA_ERROR_INVALID_VALUE: return fail(cudaErrorInvalidValue);
    case CUDA_ERROR_OUT_OF_MEMORY: return fail(cudaErrorMemoryAllocation);
    default: return fail(cudaErrorUnknown);
  }
}

/* Lazy initialization: the primary context of device 0 becomes current. */
static cudaError_t lazy_init(void) {
  __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
  pthread_once(&once, load);
  if (!load_ok) return fail(cudaErrorInitializationError);
  CUcontext ctx = NULL;
  if (drv.get_current(&ctx) == CUDA_SUCCESS && ctx != NULL) return cudaSuccess;
  CUdevice dev;
  if (drv.init(0) != CUDA_SUCCESS || drv.device_get(&dev, 0) != CUDA_SUCCESS ||
      drv.retain(&ctx, dev) != CUDA_SUCCESS || drv.set_current(ctx) != CUDA_SUCCESS)
    return fail(cudaErrorInitializationError);
  return cudaSuccess;
}

EXPORT cudaError_t cudaMalloc(void** p, size_t n) {
  cudaError_t e = lazy_init();
  if (e != cudaSuccess) return e;
  if (p == NULL) return fail(cudaErrorInvalidValue);
  if (n == 0) {
    *p = NULL;
    return cudaSuccess;
  }
  CUdeviceptr d = 0;
  e = map(drv.alloc(&d, n));
  if (e == cudaSuccess) *p = (void*)(uintptr_t)d;
  return e;
}

EXPORT cudaError_t cudaFree(void* p) {
  cudaError_t e = lazy_init();
  if (e != cudaSuccess || p == NULL) return e;
  return map(drv.release((CUdeviceptr)(uintptr_t)p));
}

static cudaError_t malloc_async(void** p, size_t n, cudaStream_t s, int ptsz) {
  cudaError_t e = lazy_init();
  if (e != cudaSuccess) return e;
  if (p == NULL) return fail(cudaErrorInvalidValue);
  CUdeviceptr d = 0;
  e = map(ptsz ? drv.alloc_async_ptsz(&d, n, (CUstream)s) : drv.alloc_async(&d, n, (CUstream)s));
  if (e == cudaSuccess) *p = (void*)(uintptr_t)d;
  return e;
}
EXPORT cudaError_t cudaMallocAsync(void** p, size_t n, cudaStream_t s) { return malloc_async(p, n, s, 0); }
EXPORT cudaError_t cudaMallocAsync_ptsz(void** p, size_t n, cudaStream_t s) { return malloc_async(p, n, s, 1); }

static cudaError_t free_async(void* p, cudaStream_t s, int ptsz) {
  cudaError_t e = lazy_init();
  if (e != cudaSuccess) return e;
  CUdeviceptr d = (CUdeviceptr)(uintptr_t)p;
  return map(ptsz ? drv.free_async_ptsz(d, (CUstream)s) : drv.free_async(d, (CUstream)s));
}
EXPORT cudaError_t cudaFreeAsync(void* p, cudaStream_t s) { return free_async(p, s, 0); }
EXPORT cudaError_t cudaFreeAsync_ptsz(void* p, cudaStream_t s) { return free_async(p, s, 1); }

EXPORT cudaError_t cudaMemGetInfo(size_t* f, size_t* t) {
  cudaError_t e = lazy_init();
  if (e != cudaSuccess) return e;
  return map(drv.get_info(f, t));
}

/* Pinned host memory: cudaMallocHost is cudaHostAlloc with no flag. */
EXPORT cudaError_t cudaHostAlloc(void** p, size_t n, unsigned int flags) {
  cudaError_t e = lazy_init();
  if (e != cudaSuccess) return e;
  if (p == NULL) return fail(cudaErrorInvalidValue);
  return map(drv.host_alloc(p, n, flags));
}
EXPORT cudaError_t cudaMallocHost(void** p, size_t n) { return cudaHostAlloc(p, n, 0); }
/* Like the real cudart: the driver's answer (cuMemHostGetFlags) as is. */
EXPORT cudaError_t cudaHostGetFlags(unsigned int* flags, void* p) {
  cudaError_t e = lazy_init();
  if (e != cudaSuccess) return e;
  return map(drv.host_get_flags(flags, p));
}
EXPORT cudaError_t cudaFreeHost(void* p) {
  cudaError_t e = lazy_init();
  if (e != cudaSuccess || p == NULL) return e;
  return map(drv.free_host(p));
}

EXPORT cudaError_t cudaGetLastError(void) {
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

EXPORT unsigned long fake_cudart_calls(void) { return __atomic_load_n(&calls, __ATOMIC_RELAXED); }
