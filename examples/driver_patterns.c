/* driver_patterns.c — device memory through the CUDA driver API only, the
 * way JAX and numba reach it: dlopen("libcuda.so.1") and dlsym on the handle.
 * Plain C, needs only cuda.h to build (no libcuda at link time), so it builds
 * on any machine and runs against a real driver or the test suite's fake
 * libcuda.so.1 (which implements exactly the functions used here).
 *
 * Patterns: many sizes, each verified by copying a pattern in and out and by
 * a memset; a block freed and allocated again many times; two streams with
 * cuMemAllocAsync/cuMemFreeAsync, including a block freed on the other
 * stream.  Prints a few friendly lines and `driver_patterns: PASS` (exit 0)
 * or `driver_patterns: FAIL` (exit 1); exit 77 when there is no driver. */
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB (1024.0 * 1024.0)
#define GiB (MiB * 1024.0)

/* --- the driver entry points, looked up by their ABI names --- */
static struct {
  CUresult (*Init)(unsigned);
  CUresult (*DeviceGet)(CUdevice*, int);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*StreamCreate)(CUstream*, unsigned);
  CUresult (*StreamDestroy)(CUstream);
  CUresult (*MemAlloc)(CUdeviceptr*, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*MemAllocAsync)(CUdeviceptr*, size_t, CUstream);
  CUresult (*MemFreeAsync)(CUdeviceptr, CUstream);
  CUresult (*MemcpyHtoD)(CUdeviceptr, const void*, size_t);
  CUresult (*MemcpyDtoH)(void*, CUdeviceptr, size_t);
  CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream);
  CUresult (*MemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream);
  CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
  CUresult (*StreamSynchronize)(CUstream);
  CUresult (*CtxSynchronize)(void);
  CUresult (*MemGetInfo)(size_t*, size_t*);
  CUresult (*GetErrorName)(CUresult, const char**);
} cu;

static int load_driver(void) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) return 0;
  struct { void** slot; const char* name; } table[] = {
    {(void**)&cu.Init, "cuInit"},
    {(void**)&cu.DeviceGet, "cuDeviceGet"},
    {(void**)&cu.DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"},
    {(void**)&cu.CtxSetCurrent, "cuCtxSetCurrent"},
    {(void**)&cu.StreamCreate, "cuStreamCreate"},
    {(void**)&cu.StreamDestroy, "cuStreamDestroy_v2"},
    {(void**)&cu.MemAlloc, "cuMemAlloc_v2"},
    {(void**)&cu.MemFree, "cuMemFree_v2"},
    {(void**)&cu.MemAllocAsync, "cuMemAllocAsync"},
    {(void**)&cu.MemFreeAsync, "cuMemFreeAsync"},
    {(void**)&cu.MemcpyHtoD, "cuMemcpyHtoD_v2"},
    {(void**)&cu.MemcpyDtoH, "cuMemcpyDtoH_v2"},
    {(void**)&cu.MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"},
    {(void**)&cu.MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"},
    {(void**)&cu.MemsetD8, "cuMemsetD8_v2"},
    {(void**)&cu.StreamSynchronize, "cuStreamSynchronize"},
    {(void**)&cu.CtxSynchronize, "cuCtxSynchronize"},
    {(void**)&cu.MemGetInfo, "cuMemGetInfo_v2"},
    {(void**)&cu.GetErrorName, "cuGetErrorName"},
  };
  for (size_t i = 0; i < sizeof table / sizeof table[0]; ++i) {
    *table[i].slot = dlsym(h, table[i].name);
    if (!*table[i].slot) {
      printf("driver_patterns: libcuda.so.1 has no %s\n", table[i].name);
      return 0;
    }
  }
  return 1;
}

/* --- failure bookkeeping --- */
static int failures;

static int ok(CUresult r, const char* what, int line) {
  const char* name = "?";
  if (r == CUDA_SUCCESS) return 1;
  cu.GetErrorName(r, &name);
  printf("    FAIL: line %d: %s -> %s\n", line, what, name);
  ++failures;
  return 0;
}
#define CK(call) ok((call), #call, __LINE__)

static void fail(const char* what, size_t bytes) {
  printf("    FAIL: %s (%zu bytes)\n", what, bytes);
  ++failures;
}

static void section(const char* name, int failures_before, const char* detail) {
  printf("  %-8s %-4s %s\n", name, failures == failures_before ? "ok" : "FAIL", detail);
  fflush(stdout);
}

/* Words that depend on the seed and the position: a block holding another
 * block's data, or stale data, never matches. */
static void make_pattern(uint32_t* w, size_t bytes, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < bytes / 4; ++i) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    w[i] = x + (uint32_t)i;
  }
}

static uint32_t seed_of(CUdeviceptr p, uint32_t iteration) {
  return (uint32_t)(p >> 8) ^ (uint32_t)(p >> 40) ^ (iteration * 0x85EBCA6Bu);
}

static uint32_t *host_in, *host_out;
#define HOST_BYTES (64u << 20)

/* Writes a pattern, reads it back, then memsets and reads again. */
static void verify_sync(CUdeviceptr p, size_t bytes, uint32_t seed) {
  make_pattern(host_in, bytes, seed);
  if (!CK(cu.MemcpyHtoD(p, host_in, bytes)) || !CK(cu.MemcpyDtoH(host_out, p, bytes))) return;
  if (memcmp(host_in, host_out, bytes) != 0) fail("data read back differs from data written", bytes);
  if (!CK(cu.MemsetD8(p, 0xA5, bytes)) || !CK(cu.MemcpyDtoH(host_out, p, bytes))) return;
  for (size_t i = 0; i < bytes; ++i)
    if (((unsigned char*)host_out)[i] != 0xA5) { fail("memset value not read back", bytes); break; }
}

/* --- patterns --- */
static void pattern_sizes(void) {
  static const size_t sizes[] = {512, 1000, 4096, 65540, 1u << 20, (2u << 20) + 28, 10u << 20, 64u << 20};
  enum { kSizes = sizeof sizes / sizeof sizes[0], kRounds = 3 };
  CUdeviceptr p[kSizes];
  char detail[128];
  int before = failures;
  for (int round = 0; round < kRounds; ++round) {
    for (int i = 0; i < kSizes; ++i) {
      p[i] = 0;
      if (!CK(cu.MemAlloc(&p[i], sizes[i]))) continue;
      if (p[i] % 256) fail("pointer not 256-byte aligned", sizes[i]);
      make_pattern(host_in, sizes[i], seed_of(p[i], round));
      CK(cu.MemcpyHtoD(p[i], host_in, sizes[i]));
    }
    /* Read everything back only once all blocks are live: overlapping blocks
     * would have overwritten each other. */
    for (int i = 0; i < kSizes; ++i) {
      if (!p[i]) continue;
      make_pattern(host_in, sizes[i], seed_of(p[i], round));
      if (CK(cu.MemcpyDtoH(host_out, p[i], sizes[i])) && memcmp(host_in, host_out, sizes[i]))
        fail("a live block lost its data", sizes[i]);
      verify_sync(p[i], sizes[i], seed_of(p[i], round) + 1);
    }
    for (int i = kSizes - 1; i >= 0; --i)
      if (p[i]) CK(cu.MemFree(p[i]));
  }
  CK(cu.MemFree(0)); /* freeing NULL succeeds */
  snprintf(detail, sizeof detail, "%d blocks of 512 B .. 64 MiB, written and read back", kSizes * kRounds);
  section("sizes", before, detail);
}

static void pattern_reuse(void) {
  enum { kPairs = 200 };
  int before = failures;
  char detail[128];
  for (int i = 0; i < kPairs; ++i) {
    CUdeviceptr p = 0;
    size_t bytes = (size_t)(4096 + 512 * (i % 7));
    if (!CK(cu.MemAlloc(&p, bytes))) continue;
    if (i % 20 == 0) verify_sync(p, bytes, seed_of(p, 1000 + i));
    CK(cu.MemFree(p));
  }
  snprintf(detail, sizeof detail, "%d alloc/free pairs of about 4 KiB", kPairs);
  section("reuse", before, detail);
}

static void verify_async(CUdeviceptr p, size_t bytes, uint32_t seed, CUstream write, CUstream read) {
  make_pattern(host_in, bytes, seed);
  memset(host_out, 0, bytes);
  CK(cu.MemcpyHtoDAsync(p, host_in, bytes, write));
  CK(cu.StreamSynchronize(write));
  CK(cu.MemcpyDtoHAsync(host_out, p, bytes, read));
  CK(cu.StreamSynchronize(read));
  if (memcmp(host_in, host_out, bytes) != 0) fail("async copy read back differs", bytes);
}

static void pattern_streams(void) {
  enum { kIters = 32 };
  CUstream s[2] = {0, 0};
  int before = failures, n = 0;
  char detail[128];
  if (!CK(cu.StreamCreate(&s[0], CU_STREAM_NON_BLOCKING)) || !CK(cu.StreamCreate(&s[1], CU_STREAM_NON_BLOCKING)))
    return;
  for (int i = 0; i < kIters; ++i) {
    CUstream mine = s[i % 2], other = s[(i + 1) % 2];
    size_t bytes = (size_t)512 << (i % 12);
    CUdeviceptr p = 0, q = 0;
    /* Same stream: allocate, use, free, in stream order. */
    if (CK(cu.MemAllocAsync(&p, bytes, mine))) {
      verify_async(p, bytes, seed_of(p, 2000 + i), mine, mine);
      CK(cu.MemFreeAsync(p, mine));
      ++n;
    }
    /* Across streams: allocated on one, written on both, freed on the other. */
    if (CK(cu.MemAllocAsync(&q, bytes, mine))) {
      verify_async(q, bytes, seed_of(q, 3000 + i), mine, other);
      CK(cu.MemFreeAsync(q, other));
      ++n;
    }
  }
  CK(cu.CtxSynchronize());
  CK(cu.StreamDestroy(s[0]));
  CK(cu.StreamDestroy(s[1]));
  snprintf(detail, sizeof detail, "%d stream-ordered alloc/free on 2 streams", n);
  section("streams", before, detail);
}

int main(void) {
  CUdevice dev;
  CUcontext ctx;
  size_t free0 = 0, free1 = 0, total = 0;
  int before;
  char detail[128];
  if (!load_driver()) {
    printf("driver_patterns: SKIP (no CUDA driver: libcuda.so.1 not found)\n");
    return 77;
  }
  if (cu.Init(0) != CUDA_SUCCESS || cu.DeviceGet(&dev, 0) != CUDA_SUCCESS) {
    printf("driver_patterns: SKIP (the CUDA driver sees no usable GPU)\n");
    return 77;
  }
  if (!CK(cu.DevicePrimaryCtxRetain(&ctx, dev)) || !CK(cu.CtxSetCurrent(ctx))) return 1;
  host_in = malloc(HOST_BYTES);
  host_out = malloc(HOST_BYTES);
  if (!host_in || !host_out) return 1;
  CK(cu.MemGetInfo(&free0, &total));
  printf("driver_patterns: device 0, %.2f GiB free of %.2f GiB\n", free0 / GiB, total / GiB);
  pattern_sizes();
  pattern_reuse();
  pattern_streams();
  before = failures;
  CK(cu.MemGetInfo(&free1, &total));
  if (free1 + (256u << 20) < free0) fail("free memory did not come back after freeing everything", free0 - free1);
  snprintf(detail, sizeof detail, "%.2f GiB free at the end", free1 / GiB);
  section("meminfo", before, detail);
  free(host_in);
  free(host_out);
  if (failures) {
    printf("driver_patterns: FAIL (%d checks failed)\n", failures);
    return 1;
  }
  printf("driver_patterns: PASS\n");
  return 0;
}
