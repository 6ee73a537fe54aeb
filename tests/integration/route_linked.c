/* route_linked.c — a program linked against libcuda (-lcuda): the preload
 * comes first in symbol lookup, so the shim's exports answer the calls.
 * Built a second time with LINKED_IMPORTS (route_linked_imports): the
 * program then also binds at link time two driver names newer than
 * cachalloc's headers, which no hook can see (shim/link_imports.h).
 * Usage: route_linked BEHAVIOUR */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "route_common.h"

/* cuda.h declares these only for per-thread-default-stream builds. */
CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                             unsigned bz, unsigned shmem, CUstream s, void** params, void** extra);

#ifdef LINKED_IMPORTS
/* The fake libcuda's stand-ins for a newer driver's entry points. */
CUresult cuFutureWork_ptsz(void* a, int b, size_t c, void* d, unsigned e, CUstream s);
CUresult cuFutureWork(void* a, int b, size_t c, void* d, unsigned e, CUstream s);
#define ROUTE "linked_imports"

/* The start-up warning names both imports, and only them (the program
 * binds many driver names the shim exports or that name no stream), on
 * the log: run with log_file: set here, before the first CUDA call. */
static int unseen_imports_warned(void) {
  char path[] = "/tmp/cachalloc-linked-imports-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return 1;
  char conf[128];
  snprintf(conf, sizeof conf, "log_file:%s", path);
  setenv("CACHALLOC_CONF", conf, 1);
  CUdevice dev;
  CUcontext ctx;
  CUdeviceptr p = 0;
  int ok = cuInit(0) == CUDA_SUCCESS && cuDeviceGet(&dev, 0) == CUDA_SUCCESS &&
           cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS && cuCtxSetCurrent(ctx) == CUDA_SUCCESS &&
           cuMemAlloc_v2(&p, 1 << 20) == CUDA_SUCCESS && cuMemFree_v2(p) == CUDA_SUCCESS;
  char log[8192] = {0};
  ssize_t n = pread(fd, log, sizeof log - 1, 0);
  close(fd);
  unlink(path);
  const char* line = strstr(log, "newer than cachalloc's CUDA headers (");
  ok = ok && n > 0 && line != NULL;
  if (ok) {
    char names[256] = {0};
    sscanf(line + strlen("newer than cachalloc's CUDA headers ("), "%255[^)]", names);
    ok = strcmp(names, "cuFutureWork, cuFutureWork_ptsz") == 0;
    if (!ok) fprintf(stderr, "unseen imports named: %s\n", names);
  }
  if (!ok) fprintf(stderr, "the log said:\n%s\n", log);
  return ok ? 0 : 1;
}
#else
#define ROUTE "linked"
#endif

/* A name the program would bind at link time, resolved as the dynamic
 * linker does (the preloaded library first). */
static void* entry_as_linked(const char* base, int version, int per_thread, const char* exported) {
  (void)base, (void)version, (void)per_thread;
#ifdef LINKED_IMPORTS
  if (strcmp(exported, "cuFutureWork_ptsz") == 0) return (void*)cuFutureWork_ptsz;
  if (strcmp(exported, "cuFutureWork") == 0) return (void*)cuFutureWork;
#endif
  void* fn = dlsym(RTLD_DEFAULT, exported);
  if (fn == NULL) fprintf(stderr, "%s is not linkable\n", exported);
  return fn;
}

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  struct cuda_api api = {
    .init = cuInit,
    .device_get = cuDeviceGet,
    .primary_ctx_retain = cuDevicePrimaryCtxRetain,
    .ctx_set_current = cuCtxSetCurrent,
    .ctx_synchronize = cuCtxSynchronize,
    .stream_create = cuStreamCreate,
    .stream_destroy = cuStreamDestroy_v2,
    .begin_capture = cuStreamBeginCapture_v2,
    .end_capture = cuStreamEndCapture,
    .mem_alloc = cuMemAlloc_v2,
    .mem_free = cuMemFree_v2,
    .mem_alloc_async = cuMemAllocAsync,
    .mem_free_async = cuMemFreeAsync,
    .mem_alloc_async_ptsz = cuMemAllocAsync_ptsz,
    .mem_free_async_ptsz = cuMemFreeAsync_ptsz,
    .mem_get_info = cuMemGetInfo_v2,
    .memset_d8 = cuMemsetD8_v2,
    .memcpy_dtoh = cuMemcpyDtoH_v2,
    .launch_kernel = cuLaunchKernel,
    .launch_kernel_ptsz = cuLaunchKernel_ptsz,
    .event_create = cuEventCreate,
    .event_record = cuEventRecord,
    .event_query = cuEventQuery,
    .host_alloc = cuMemHostAlloc,
    .alloc_host = cuMemAllocHost_v2,
    .free_host = cuMemFreeHost,
    .host_get_flags = cuMemHostGetFlags,
    .host_get_device_pointer = cuMemHostGetDevicePointer_v2,
    .host_register = cuMemHostRegister_v2,
    .host_unregister = cuMemHostUnregister,
    .pointer_get_attribute = cuPointerGetAttribute,
    .pointer_get_attributes = cuPointerGetAttributes,
    .get_address_range = cuMemGetAddressRange_v2,
    .memcpy_htod_async = cuMemcpyHtoDAsync_v2,
    .ctx_destroy = cuCtxDestroy_v2,
    .entry = entry_as_linked,
    .fake_stats = fake_cuda_stats,
    .fake_hold = fake_cuda_hold_stream,
    .fake_on_begin = fake_cuda_on_begin_capture,
    .fake_on_mem_alloc = fake_cuda_on_mem_alloc,
    .fake_raw = fake_cuda_lookup_raw,
    .fake_fail = fake_cuda_fail,
  };
#ifdef LINKED_IMPORTS
  if (strcmp(argv[1], "unseen_imports_warned") == 0) return unseen_imports_warned();
#endif
  return run_behaviour(ROUTE, argv[1], &api);
}
