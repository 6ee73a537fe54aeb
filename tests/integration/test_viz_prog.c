/* test_viz_prog.c — a driver-API program for test_viz.sh: leaves every kind
 * of snapshot block and trace event behind, on each of argv[1] devices
 * (FAKE_CUDA_DEVICES must allow them), so that `cachalloc-report viz` has
 * something of each to convert:
 *   - cuMemAlloc_v2 of small and large sizes, some freed (alloc, free,
 *     active_allocated and inactive blocks, small and large segments);
 *   - a request of 1 TiB (oom);
 *   - a large block freed, then cachalloc_empty_cache(device) (empty_cache
 *     and the segment frees or page unmaps it causes);
 *   - a few more allocations after it;
 *   - cuMemAllocAsync on a stream, freed on another stream that is held
 *     busy (fake_cuda_hold_stream): the block stays active_pending_free.
 * Device d allocates sizes scaled by d + 1, so the devices' records differ.
 * Prints "done" and exits 0; 77 when cachalloc is not preloaded (the test
 * needs its reports). */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "fake_libcuda.h"

static void check(CUresult r, const char* what, int device) {
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "test_viz_prog: device %d: %s failed: %d\n", device, what, (int)r);
    exit(2);
  }
}

static void exercise(int d, int (*empty_cache)(int)) {
  CUdevice dev;
  CUcontext ctx;
  check(cuDeviceGet(&dev, d), "cuDeviceGet", d);
  check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain", d);
  check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent", d);
  const size_t scale = (size_t)d + 1;
  CUdeviceptr small[8], large[3], kept[2], async_block;
  for (int i = 0; i < 8; ++i) check(cuMemAlloc_v2(&small[i], scale * (size_t)(i + 1) * 3000), "cuMemAlloc_v2", d);
  for (int i = 0; i < 3; ++i) check(cuMemAlloc_v2(&large[i], scale * (size_t)(i + 2) * (3u << 20)), "cuMemAlloc_v2", d);
  for (int i = 0; i < 8; i += 2) check(cuMemFree_v2(small[i]), "cuMemFree_v2", d);
  check(cuMemFree_v2(large[1]), "cuMemFree_v2", d);

  /* a large block freed whole: empty_cache gives its segment (or, with
   * expandable segments, its 20 MiB pages) back */
  CUdeviceptr big;
  check(cuMemAlloc_v2(&big, scale * (45u << 20)), "cuMemAlloc_v2", d);
  check(cuMemFree_v2(big), "cuMemFree_v2", d);

  CUdeviceptr huge;
  if (cuMemAlloc_v2(&huge, (size_t)1 << 40) != CUDA_ERROR_OUT_OF_MEMORY) {
    fprintf(stderr, "test_viz_prog: device %d: 1 TiB did not fail with out of memory\n", d);
    exit(3);
  }
  if (empty_cache != NULL && empty_cache(d) != 0) {
    fprintf(stderr, "test_viz_prog: device %d: cachalloc_empty_cache failed\n", d);
    exit(4);
  }
  check(cuMemAlloc_v2(&kept[0], scale * 7000), "cuMemAlloc_v2", d);
  check(cuMemAlloc_v2(&kept[1], scale * (7u << 20)), "cuMemAlloc_v2", d);

  /* freed on a busy stream other than its own: parked until that stream's
   * work completes, which it never does before exit (last, because the
   * out-of-memory path and empty_cache wait for parked blocks) */
  CUstream s1, s2;
  check(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING), "cuStreamCreate", d);
  check(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING), "cuStreamCreate", d);
  check(cuMemAllocAsync(&async_block, scale * (5u << 20), s1), "cuMemAllocAsync", d);
  fake_cuda_hold_stream(s2, 1);
  check(cuMemFreeAsync(async_block, s2), "cuMemFreeAsync", d);
}

int main(int argc, char** argv) {
  int ndev = argc > 1 ? atoi(argv[1]) : 1;
  int (*empty_cache)(int) = (int (*)(int))dlsym(RTLD_DEFAULT, "cachalloc_empty_cache");
  if (empty_cache == NULL) {
    fprintf(stderr, "test_viz_prog: cachalloc is not preloaded\n");
    return 77;
  }
  check(cuInit(0), "cuInit", 0);
  for (int d = 0; d < ndev; ++d) exercise(d, empty_cache);
  printf("done\n");
  return 0;
}
