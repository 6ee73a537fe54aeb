/* fake_cudart_extra.c — the few runtime functions alloc_bench calls that the
 * test suite's fake shared cudart (tests/fake/fake_libcudart.c) does not
 * have, over the fake driver, reached the way cudart reaches the driver
 * (dlopen("libcuda.so.1") + dlsym, so the shim's and the floor's dlsym hooks
 * see the lookups).  Only for the test bench_harness_fake_driver: alloc_bench
 * built as host C++ (alloc_bench_fake.cpp) against both libraries, run bare,
 * under floor_preload.so and under libcachalloc.so. */
#define _GNU_SOURCE
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#define EXPORT __attribute__((visibility("default")))

static void* drv(const char* name) {
  static void* h;
  if (h == NULL) h = dlopen("libcuda.so.1", RTLD_NOW);
  return h ? dlsym(h, name) : NULL;
}

/* As cudart: the primary context of device 0 current in the calling thread. */
static void make_current(void) {
  CUcontext ctx = 0;
  ((CUresult(*)(unsigned))drv("cuInit"))(0);
  ((CUresult(*)(CUcontext*, CUdevice))drv("cuDevicePrimaryCtxRetain"))(&ctx, 0);
  ((CUresult(*)(CUcontext))drv("cuCtxSetCurrent"))(ctx);
}

EXPORT cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
EXPORT cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* p, int d) {
  (void)p;
  (void)d;
  return cudaErrorNotSupported;
}
EXPORT cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t p, enum cudaMemPoolAttr a, void* v) {
  (void)p;
  (void)a;
  (void)v;
  return cudaErrorNotSupported;
}
EXPORT cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = 13000;
  return cudaSuccess;
}
EXPORT cudaError_t cudaDriverGetVersion(int* v) {
  *v = 13000;
  return cudaSuccess;
}
EXPORT const char* cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorFake"; }
EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  make_current();
  CUresult (*fn)(CUstream*, unsigned) = (CUresult(*)(CUstream*, unsigned))drv("cuStreamCreate");
  return fn((CUstream*)s, flags) == CUDA_SUCCESS ? cudaSuccess : cudaErrorUnknown;
}
EXPORT cudaError_t cudaStreamDestroy(cudaStream_t s) {
  CUresult (*fn)(CUstream) = (CUresult(*)(CUstream))drv("cuStreamDestroy_v2");
  return fn((CUstream)s) == CUDA_SUCCESS ? cudaSuccess : cudaErrorUnknown;
}
EXPORT cudaError_t cudaDeviceSynchronize(void) {
  make_current();
  CUresult (*fn)(void) = (CUresult(*)(void))drv("cuCtxSynchronize");
  return fn() == CUDA_SUCCESS ? cudaSuccess : cudaErrorUnknown;
}
