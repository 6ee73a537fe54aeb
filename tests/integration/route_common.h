/* route_common.h — the driver API as a route test program reached it.
 *
 * Three programs reach the (fake) driver the way real clients do: static
 * cudart (route_static_cudart.c), JAX/numba (route_dlsym.c) and a program
 * linked against libcuda (route_linked.c).  Each fills a cuda_api and
 * runs one behaviour by name (argv[1]); the behaviours are shared
 * (route_behaviours.c) so every route is held to the same rules. */
#ifndef CACHALLOC_ROUTE_COMMON_H
#define CACHALLOC_ROUTE_COMMON_H

#include <stdio.h>

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
  PFN_cuLaunchKernel_v4000 launch_kernel;
  PFN_cuLaunchKernel_v7000_ptsz launch_kernel_ptsz;
  PFN_cuEventCreate_v2000 event_create;
  PFN_cuEventRecord_v2000 event_record;
  PFN_cuEventQuery_v2000 event_query;
  /* Pinned host memory (host_behaviours.c). */
  PFN_cuMemHostAlloc_v2020 host_alloc;
  PFN_cuMemAllocHost_v3020 alloc_host;
  PFN_cuMemFreeHost_v2000 free_host;
  PFN_cuMemHostGetFlags_v2030 host_get_flags;
  PFN_cuMemHostGetDevicePointer_v3020 host_get_device_pointer;
  PFN_cuMemHostRegister_v6050 host_register;
  PFN_cuMemHostUnregister_v4000 host_unregister;
  PFN_cuPointerGetAttribute_v4000 pointer_get_attribute;
  PFN_cuPointerGetAttributes_v7000 pointer_get_attributes;
  PFN_cuMemGetAddressRange_v3020 get_address_range;
  PFN_cuMemcpyHtoDAsync_v3020 memcpy_htod_async;
  PFN_cuCtxDestroy_v4000 ctx_destroy;
  /* Any entry point as this route finds it: by base name, cudaVersion and
   * per-thread flag through cuGetProcAddress, by exported name through
   * dlsym or the link (watch_behaviours.c). */
  void* (*entry)(const char* base, int version, int per_thread, const char* exported);
  /* Test controls of the fake driver (never hooked: no "cu" prefix). */
  void (*fake_stats)(struct fake_cuda_stats_t*);
  void (*fake_hold)(CUstream, int);
  void* (*fake_raw)(const char*);
  void (*fake_on_begin)(void (*)(void*), void*);
  void (*fake_on_mem_alloc)(void (*)(void*), void*);
  void (*fake_fail)(const char*, int, int, CUresult);
};

/* What every behaviour shares (route_behaviours.c): the route's name for
 * messages, its functions, device 0's primary context (current when a
 * behaviour starts), the fake driver's counters now. */
extern const char* g_route;
extern const struct cuda_api* A;
extern CUcontext g_ctx;
struct fake_cuda_stats_t stats(void);

/* A behaviour returns 0 on success, 77 to skip, else 1 after a message. */
#define CHECK(cond)                                                                           \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      fprintf(stderr, "[%s] %s:%d: check failed: %s\n", g_route, __FILE__, __LINE__, #cond); \
      return 1;                                                                               \
    }                                                                                         \
  } while (0)
#define CHECK_CU(call) CHECK((call) == CUDA_SUCCESS)

typedef int (*behaviour_fn)(void);
/* The stream-order behaviours (stream_order_behaviours.c) by name, or NULL. */
/* Frees p while the held per-thread stream may still use it and checks that
 * the next allocation of `size` is not p unless something waited; then
 * releases the stream and frees the new block (0: passed). */
int freed_block_waits_for_per_thread(CUdeviceptr p, size_t size);
behaviour_fn stream_order_behaviour(const char* name);
/* The pinned host memory behaviours (host_behaviours.c) by name, or NULL. */
behaviour_fn host_behaviour(const char* name);
/* Work on the per-thread stream through every kind of entry point
 * (watch_behaviours.c), or NULL. */
behaviour_fn watch_behaviour(const char* name);
/* The per-thread cache behaviours (thread_cache_behaviours.c), or NULL. */
behaviour_fn thread_cache_behaviour(const char* name);
/* The forked-child behaviours (fork_behaviours.c), or NULL. */
behaviour_fn fork_behaviour(const char* name);
/* Blocks held for graph captures (graph_behaviours.c), or NULL. */
behaviour_fn graph_behaviour(const char* name);

/* Runs behaviour `name`; returns 0 pass, 77 skip, else fail (with a message
 * on stderr).  `route` names the route for messages. */
int run_behaviour(const char* route, const char* name, const struct cuda_api* api);

/* Every pointer in `api` set? Prints the first missing one. */
int api_complete(const struct cuda_api* api);

#endif
