/* route_common.h — the driver API as a route test program reached it.
 *
 * Three programs reach the (fake) driver the way real clients do: static
 * cudart (route_static_cudart.c), JAX/numba (route_dlsym.c) and a program
 * linked against libcuda (route_linked.c).  Each fills a cuda_api and
 * runs one behaviour by name (argv[1]); the behaviours are shared
 * (route_behaviours.c) so every route is held to the same rules. */
#ifndef CACHALLOC_ROUTE_COMMON_H
#define CACHALLOC_ROUTE_COMMON_H

#include <cuda.h>
#include <cudaTypedefs.h>

#include "fake_libcuda.h"

typedef CUresult (*ctx_create_fn)(CUcontext*, unsigned int, CUdevice);

struct cuda_api {
  PFN_cuInit_v2000 init;
  PFN_cuDeviceGet_v2000 device_get;
  PFN_cuDevicePrimaryCtxRetain_v7000 primary_ctx_retain;
  PFN_cuCtxSetCurrent_v4000 ctx_set_current;
  PFN_cuCtxSynchronize_v2000 ctx_synchronize;
  PFN_cuStreamCreate_v2000 stream_create;
  PFN_cuStreamDestroy_v4000 stream_destroy;
  PFN_cuStreamBeginCapture_v10010 begin_capture;
  PFN_cuStreamEndCapture_v10000 end_capture;
  PFN_cuMemAlloc_v3020 mem_alloc;
  PFN_cuMemFree_v3020 mem_free;
  PFN_cuMemAllocAsync_v11020 mem_alloc_async;
  PFN_cuMemFreeAsync_v11020 mem_free_async;
  PFN_cuMemAllocAsync_v11020_ptsz mem_alloc_async_ptsz;
  PFN_cuMemFreeAsync_v11020_ptsz mem_free_async_ptsz;
  PFN_cuMemGetInfo_v3020 mem_get_info;
  PFN_cuMemsetD8_v3020 memset_d8;
  PFN_cuMemcpyDtoH_v3020 memcpy_dtoh;
  /* Test controls of the fake driver (never hooked: no "cu" prefix). */
  void (*fake_stats)(struct fake_cuda_stats_t*);
  void (*fake_hold)(CUstream, int);
  void* (*fake_raw)(const char*);
};

/* Runs behaviour `name`; returns 0 pass, 77 skip, else fail (with a message
 * on stderr).  `route` names the route for messages. */
int run_behaviour(const char* route, const char* name, const struct cuda_api* api);

/* Every pointer in `api` set? Prints the first missing one. */
int api_complete(const struct cuda_api* api);

#endif
