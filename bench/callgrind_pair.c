/* callgrind_pair.c — a fixed number of cached malloc+free pairs through the
 * shim, for instruction counting (bench/callgrind-pair.sh).
 *
 * Reaches the driver through dlsym on the libcuda handle (numba's route),
 * so under LD_PRELOAD=libcachalloc.so the calls land in the shim and the
 * fake libcuda only answers the context query.  bench/callgrind-pair.sh
 * runs it twice with different pair counts under callgrind and divides the
 * difference in instructions by the difference in pairs: start-up,
 * configuration and exit cancel out.
 *
 * Usage: callgrind_pair MODE PAIRS SIZE
 *   MODE  plain      cuMemAlloc_v2 + cuMemFree_v2, legacy stream only
 *         blocking   the same with one blocking stream alive
 *         nonblocking  the same with one non-blocking stream alive
 *         async      cuMemAllocAsync + cuMemFreeAsync on one stream */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cudaTypedefs.h>

#define LOOKUP(type, name) ((type)dlsym(h, name))

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s plain|blocking|nonblocking|async PAIRS SIZE\n", argv[0]);
    return 2;
  }
  const char* mode = argv[1];
  const long pairs = atol(argv[2]);
  const size_t size = (size_t)atol(argv[3]);
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) return 1;
  PFN_cuInit_v2000 init = LOOKUP(PFN_cuInit_v2000, "cuInit");
  PFN_cuDeviceGet_v2000 device_get = LOOKUP(PFN_cuDeviceGet_v2000, "cuDeviceGet");
  PFN_cuDevicePrimaryCtxRetain_v7000 retain = LOOKUP(PFN_cuDevicePrimaryCtxRetain_v7000, "cuDevicePrimaryCtxRetain");
  PFN_cuCtxSetCurrent_v4000 set_current = LOOKUP(PFN_cuCtxSetCurrent_v4000, "cuCtxSetCurrent");
  PFN_cuStreamCreate_v2000 stream_create = LOOKUP(PFN_cuStreamCreate_v2000, "cuStreamCreate");
  PFN_cuMemAlloc_v3020 alloc = LOOKUP(PFN_cuMemAlloc_v3020, "cuMemAlloc_v2");
  PFN_cuMemFree_v3020 release = LOOKUP(PFN_cuMemFree_v3020, "cuMemFree_v2");
  PFN_cuMemAllocAsync_v11020 alloc_async = LOOKUP(PFN_cuMemAllocAsync_v11020, "cuMemAllocAsync");
  PFN_cuMemFreeAsync_v11020 free_async = LOOKUP(PFN_cuMemFreeAsync_v11020, "cuMemFreeAsync");
  CUdevice dev;
  CUcontext ctx;
  if (init(0) || device_get(&dev, 0) || retain(&ctx, dev) || set_current(ctx)) return 1;

  CUstream s = NULL;
  if (strcmp(mode, "blocking") == 0 || strcmp(mode, "async") == 0) {
    if (stream_create(&s, CU_STREAM_DEFAULT)) return 1;
  } else if (strcmp(mode, "nonblocking") == 0) {
    if (stream_create(&s, CU_STREAM_NON_BLOCKING)) return 1;
  } else if (strcmp(mode, "plain") != 0) {
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
  }
  const int async = strcmp(mode, "async") == 0;
  for (long i = 0; i < pairs; ++i) {
    CUdeviceptr p;
    CUresult r = async ? alloc_async(&p, size, s) : alloc(&p, size);
    if (r == CUDA_SUCCESS) r = async ? free_async(p, s) : release(p);
    if (r != CUDA_SUCCESS) {
      fprintf(stderr, "pair %ld failed: %d\n", i, (int)r);
      return 1;
    }
  }
  return 0;
}
