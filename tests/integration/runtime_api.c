/* runtime_api.c — a shared-cudart program (linked against the fake
 * libcudart.so.13): the shim's cudaMalloc family answers by itself where it
 * safely can and otherwise leaves the call to cudart, whose error codes and
 * last-error state stay exact.
 * Usage: runtime_api BEHAVIOUR   (env RUNTIME_HOOKS=0 when the library was
 * built without them: then every call must reach cudart). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "check.h"
#include "fake_libcuda.h"

unsigned long fake_cudart_calls(void);

static int hooks = 1;

static struct fake_cuda_stats_t stats(void) {
  struct fake_cuda_stats_t s;
  fake_cuda_stats(&s);
  return s;
}

/* cudaFree(0) initializes through cudart; later allocations are served by
 * the shim without reaching cudart (with the hooks built in), and by the
 * cache either way. */
static int served(void) {
  void *p = NULL, *q = NULL;
  CHECK(cudaFree(NULL) == cudaSuccess);
  unsigned long before = fake_cudart_calls();
  CHECK(cudaMalloc(&p, 1000) == cudaSuccess);
  CHECK(cudaFree(p) == cudaSuccess);
  CHECK(cudaMalloc(&q, 1000) == cudaSuccess);
  CHECK(q == p);
  CHECK(stats().mem_alloc == 1);
  CHECK(fake_cudart_calls() == before + (hooks ? 0 : 3));
  CHECK(cudaFree(q) == cudaSuccess);
  return 0;
}

/* With no context current the first call must go to cudart (lazy init). */
static int lazy_init(void) {
  void* p = NULL;
  CHECK(cudaMalloc(&p, 1000) == cudaSuccess);
  CHECK(fake_cudart_calls() == 1);
  CHECK(stats().mem_alloc == 1); /* cudart's own call still hit the cache */
  CHECK(cudaFree(p) == cudaSuccess);
  return 0;
}

/* Errors are cudart's: codes and last-error state. */
static int errors(void) {
  void *p = NULL, *q = NULL, *z = (void*)1;
  CHECK(cudaFree(NULL) == cudaSuccess);
  CHECK(cudaMalloc(&z, 0) == cudaSuccess && z == NULL);
  CHECK(cudaMalloc(&p, 4096) == cudaSuccess);
  CHECK(cudaFree((char*)p + 512) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(cudaFree(p) == cudaSuccess);
  CHECK(cudaFree(p) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  unsigned long failed = stats().mem_alloc_failed;
  CHECK(cudaMalloc(&q, (size_t)1 << 40) == cudaErrorMemoryAllocation);
  CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
  /* The cache's retry path ran once, not again when cudart reproduced the
   * error: one refused device allocation for the request and one for the
   * retry after releasing the cache. */
  CHECK(stats().mem_alloc_failed - failed <= 2);
  CHECK(cudaMalloc(&q, 4096) == cudaSuccess); /* later allocations work */
  CHECK(stats().mem_free_invalid == 0); /* nothing invalid reached the driver */
  return 0;
}

static int async(void) {
  void *p = NULL, *q = NULL;
  CHECK(cudaFree(NULL) == cudaSuccess);
  unsigned long before = fake_cudart_calls();
  CHECK(cudaMallocAsync(&p, 4096, 0) == cudaSuccess);
  CHECK(cudaFreeAsync(p, 0) == cudaSuccess);
  CHECK(cudaMallocAsync(&q, 4096, 0) == cudaSuccess);
  CHECK(q == p);
  CHECK(stats().mem_alloc_async == 0);
  CHECK(fake_cudart_calls() == before + (hooks ? 0 : 3));
  size_t f = 0, t = 0;
  CHECK(cudaMemGetInfo(&f, &t) == cudaSuccess && t == stats().total_bytes);
  return 0;
}

/* A pointer the cache does not own goes to cudart and on to the driver. */
static int foreign(void) {
  CHECK(cudaFree(NULL) == cudaSuccess);
  CUresult (*raw)(CUdeviceptr*, size_t) = (CUresult(*)(CUdeviceptr*, size_t))fake_cuda_lookup_raw("cuMemAlloc_v2");
  CUdeviceptr d = 0;
  CHECK(raw(&d, 4096) == CUDA_SUCCESS);
  CHECK(cudaFree((void*)(uintptr_t)d) == cudaSuccess);
  CHECK(stats().mem_free == 1);
  return 0;
}

/* A block of another context, freed with a third one current: served in
 * its own context (made current for the free, the caller's restored), by
 * the shim alone with the hooks (no cudart call, so no second pass through
 * the hooked cuMemFree_v2); the cache then reuses it there. */
static int other_context(void) {
  void *p = NULL, *q = NULL;
  CUcontext a = NULL, b = NULL, cur = NULL;
  CHECK(cudaFree(NULL) == cudaSuccess);
  CHECK(cuCtxGetCurrent(&a) == CUDA_SUCCESS && a != NULL);
  CHECK(cuCtxCreate_v2(&b, 0, 0) == CUDA_SUCCESS); /* current from here on */
  CHECK(cudaMalloc(&p, 4096) == cudaSuccess);
  CHECK(cuCtxSetCurrent(a) == CUDA_SUCCESS);
  unsigned long before = fake_cudart_calls();
  CHECK(cudaFree(p) == cudaSuccess);
  CHECK(fake_cudart_calls() == before + (hooks ? 0 : 1));
  CHECK(cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == a);
  CHECK(stats().mem_free == 0);
  CHECK(cuCtxSetCurrent(b) == CUDA_SUCCESS);
  CHECK(cudaMalloc(&q, 4096) == cudaSuccess);
  CHECK(q == p);
  CHECK(stats().mem_alloc == 1);
  /* Stream-ordered: the same. */
  CHECK(cuCtxSetCurrent(a) == CUDA_SUCCESS);
  before = fake_cudart_calls();
  CHECK(cudaFreeAsync(q, 0) == cudaSuccess);
  CHECK(fake_cudart_calls() == before + (hooks ? 0 : 1));
  CHECK(stats().mem_free == 0 && stats().mem_free_async == 0);
  return 0;
}

/* Pinned host memory: cudaHostAlloc / cudaMallocHost served by the host
 * cache (by the shim itself with the hooks, else through cudart's driver
 * calls); cudaHostGetFlags answers as for a fresh allocation; errors,
 * double frees included, are cudart's. */
static int host(void) {
  void *p = NULL, *q = NULL, *r = NULL;
  CHECK(cudaFree(NULL) == cudaSuccess);
  unsigned long before = fake_cudart_calls();
  CHECK(cudaHostAlloc(&p, 10000, cudaHostAllocMapped) == cudaSuccess);
  CHECK(cudaFreeHost(p) == cudaSuccess);
  CHECK(cudaHostAlloc(&q, 16384, cudaHostAllocMapped) == cudaSuccess);
  CHECK(q == p);
  CHECK(cudaMallocHost(&r, 10000) == cudaSuccess);
  CHECK(r != p); /* other flags */
  CHECK(stats().host_alloc == 2);
  CHECK(fake_cudart_calls() == before + (hooks ? 0 : 4));
  /* cudaHostGetFlags asks the (hooked) driver: a portable block placed in
   * the chunk of the mapped ones (fake_host.c) answers what a fresh
   * portable allocation would, not the chunk's 0x2. */
  void* s = NULL;
  unsigned flags = 0;
  CHECK(cudaHostAlloc(&s, 10000, cudaHostAllocPortable) == cudaSuccess);
  CHECK(cudaHostGetFlags(&flags, s) == cudaSuccess);
  CHECK(flags == (cudaHostAllocPortable | cudaHostAllocMapped));
  CHECK(cudaHostGetFlags(&flags, r) == cudaSuccess);
  CHECK(flags == cudaHostAllocMapped);
  CHECK(cudaFreeHost(s) == cudaSuccess);
  CHECK(cudaFreeHost(q) == cudaSuccess);
  CHECK(cudaFreeHost(q) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaFreeHost((char*)r + 8) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaFreeHost(r) == cudaSuccess);
  CHECK(stats().host_free == 0 && stats().host_free_invalid == 0);
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const char* h = getenv("RUNTIME_HOOKS");
  hooks = h == NULL || strcmp(h, "0") != 0;
  if (!strcmp(argv[1], "served")) return served();
  if (!strcmp(argv[1], "lazy_init")) return lazy_init();
  if (!strcmp(argv[1], "errors")) return errors();
  if (!strcmp(argv[1], "async")) return async();
  if (!strcmp(argv[1], "foreign")) return foreign();
  if (!strcmp(argv[1], "host")) return host();
  if (!strcmp(argv[1], "other_context")) return other_context();
  fprintf(stderr, "unknown behaviour %s\n", argv[1]);
  return 1;
}
