/* watch_behaviours.c — work on a thread's per-thread default stream through
 * entry points the shim once did not watch, and through entry points newer
 * than its headers, on each route.
 *
 * Each behaviour runs the arrangement of per_thread_beside_blocking
 * (stream_order_behaviours.c): one created blocking stream (one sequence
 * so far), then work on the per-thread stream P through the entry point
 * under test, still running when p is freed; the next allocation of that
 * size must not be p unless something waited for P.  Before the generated
 * wrappers and thunks (shim/stream_watch.h) each of these handed p out at
 * once.  A program linked against libcuda binds at link time only the names
 * cachalloc exports, which cannot include names newer than its headers:
 * those behaviours skip on the linked route.  route_linked_imports binds
 * two such names at link time; there the imports are read at start-up and
 * every plain free fences (shim/link_imports.h, docs/INTERPOSER.md). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "route_common.h"

#define MiB ((size_t)1 << 20)

typedef CUresult (*work_fn)(void* fn);

/* The arrangement; `fn` is the entry point, `work` calls it on P. */
static int beside_blocking(void* fn, work_fn work) {
  CUstream s;
  CUdeviceptr p = 0;
  CHECK(fn != NULL);
  CHECK_CU(A->stream_create(&s, 0));
  CHECK_CU(A->mem_alloc(&p, MiB));
  CHECK_CU(work(fn));
  CHECK(stats().per_thread_launches == 1); /* the fake saw the work on P */
  A->fake_hold(CU_STREAM_PER_THREAD, 1);
  if (freed_block_waits_for_per_thread(p, MiB) != 0) return 1;
  CHECK_CU(A->stream_destroy(s));
  return 0;
}

static int linked_route(void) { return strcmp(g_route, "linked") == 0; }

static CUresult atod(void* fn) { return ((PFN_cuMemcpyAtoD_v7000_ptds)fn)(0, NULL, 0, 16); }
static int watch_memcpy_atod_ptds(void) {
  return beside_blocking(A->entry("cuMemcpyAtoD", 12000, 1, "cuMemcpyAtoD_v2_ptds"), atod);
}

static CUresult dtoa(void* fn) { return ((PFN_cuMemcpyDtoA_v7000_ptds)fn)(NULL, 0, 0, 16); }
static int watch_memcpy_dtoa_ptds(void) {
  return beside_blocking(A->entry("cuMemcpyDtoA", 12000, 1, "cuMemcpyDtoA_v2_ptds"), dtoa);
}

static CUresult batch_12080(void* fn) {
  size_t fail = 0;
  return ((PFN_cuMemcpyBatchAsync_v12080_ptsz)fn)(NULL, NULL, NULL, 0, NULL, NULL, 0, &fail, NULL);
}
static int watch_batch_copy_12080_ptsz(void) {
  return beside_blocking(A->entry("cuMemcpyBatchAsync", 12080, 1, "cuMemcpyBatchAsync_ptsz"), batch_12080);
}

static CUresult batch_13000(void* fn) {
  return ((PFN_cuMemcpyBatchAsync_v13000_ptsz)fn)(NULL, NULL, NULL, 0, NULL, NULL, 0, NULL);
}
static int watch_batch_copy_13000_ptsz(void) {
  return beside_blocking(A->entry("cuMemcpyBatchAsync", 13000, 1, "cuMemcpyBatchAsync_v2_ptsz"), batch_13000);
}

static CUresult wait_value(void* fn) { return ((PFN_cuStreamWaitValue32_v11070_ptsz)fn)(NULL, 0, 1, 0); }
static int watch_wait_value_ptsz(void) {
  return beside_blocking(A->entry("cuStreamWaitValue32", 12000, 1, "cuStreamWaitValue32_v2_ptsz"), wait_value);
}

static CUresult decompress(void* fn) {
  size_t err = 0;
  return ((PFN_cuMemBatchDecompressAsync_v12060_ptsz)fn)(NULL, 0, 0, &err, NULL);
}
static int watch_decompress_ptsz(void) {
  return beside_blocking(A->entry("cuMemBatchDecompressAsync", 12060, 1, "cuMemBatchDecompressAsync_ptsz"),
                         decompress);
}

/* The plain entry point, told CU_STREAM_PER_THREAD. */
static CUresult grid(void* fn) { return ((PFN_cuLaunchGridAsync_v2000)fn)(NULL, 1, 1, CU_STREAM_PER_THREAD); }
static int watch_grid_launch_per_thread_handle(void) {
  return beside_blocking(A->entry("cuLaunchGridAsync", 12000, 0, "cuLaunchGridAsync"), grid);
}

/* Newer than the headers: a per-thread variant, a plain entry point told
 * CU_STREAM_PER_THREAD, and a new ABI of a known name (whose twelfth
 * argument, on the stack, must arrive intact through the thunk). */
typedef CUresult (*future_fn)(void*, int, size_t, void*, unsigned, CUstream);
static CUresult future_ptsz(void* fn) { return ((future_fn)fn)(NULL, 1, 2, NULL, 3, NULL); }
static int watch_unknown_ptsz(void) {
  if (linked_route()) return 77;
  return beside_blocking(A->entry("cuFutureWork", 13050, 1, "cuFutureWork_ptsz"), future_ptsz);
}
static CUresult future_plain(void* fn) { return ((future_fn)fn)(NULL, 1, 2, NULL, 3, CU_STREAM_PER_THREAD); }
static int watch_unknown_plain(void) {
  if (linked_route()) return 77;
  return beside_blocking(A->entry("cuFutureWork", 13050, 0, "cuFutureWork"), future_plain);
}
typedef CUresult (*launch_13050_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                    CUstream, void**, void**, unsigned long long);
static CUresult launch_13050(void* fn) {
  return ((launch_13050_fn)fn)(NULL, 1, 1, 1, 1, 1, 1, 0, CU_STREAM_PER_THREAD, NULL, NULL, 0x5ca1ab1eULL);
}
static int watch_new_abi_launch(void) {
  if (linked_route()) return 77;
  return beside_blocking(A->entry("cuLaunchKernel", 13050, 0, "cuLaunchKernel_v13050"), launch_13050);
}

/* One thread alone on its per-thread stream stays one sequence, whatever
 * entry point put the work there: the thunks note, they do not guess more. */
static int watch_unknown_one_thread_serial(void) {
  if (linked_route()) return 77;
  CUdeviceptr p = 0, q = 0;
  void* fn = A->entry("cuFutureWork", 13050, 1, "cuFutureWork_ptsz");
  CHECK(fn != NULL);
  CHECK_CU(A->mem_alloc(&p, MiB));
  CHECK_CU(future_ptsz(fn));
  CHECK_CU(A->mem_free(p));
  CHECK_CU(A->mem_alloc(&q, MiB));
  CHECK(q == p); /* reused at once: nothing else runs beside P */
  CHECK_CU(A->mem_free(q));
  return 0;
}

/* A plugin linked against libcuda, dlopened after the context's cache
 * exists (late_plugin.c): its link-time import of a newer name is read
 * when it loads its module, before its work can meet a block reused at
 * once.  The plugin's path: CACHALLOC_TEST_PLUGIN. */
typedef CUresult (*plugin_fn)(void);
static int watch_late_plugin(void) {
  CUstream s;
  CUdeviceptr p = 0;
  const char* path = getenv("CACHALLOC_TEST_PLUGIN");
  CHECK(path != NULL);
  CHECK_CU(A->stream_create(&s, 0)); /* the one blocking stream: one sequence */
  CHECK_CU(A->mem_alloc(&p, MiB));
  void* plugin = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (plugin == NULL) fprintf(stderr, "dlopen: %s\n", dlerror());
  CHECK(plugin != NULL);
  plugin_fn start = (plugin_fn)dlsym(plugin, "plugin_start");
  plugin_fn work = (plugin_fn)dlsym(plugin, "plugin_work");
  CHECK(start != NULL && work != NULL);
  CHECK_CU(start());
  CHECK_CU(work()); /* on this thread's per-thread stream P, still running: */
  CHECK(stats().per_thread_launches == 1);
  A->fake_hold(CU_STREAM_PER_THREAD, 1);
  if (freed_block_waits_for_per_thread(p, MiB) != 0) return 1;
  CHECK_CU(A->stream_destroy(s));
  return 0;
}

/* A green context's stream: non-blocking, and its work is never named to a
 * hook that notes streams (launches check only for the per-thread
 * stream).  Work on it still uses p when p is freed: the next allocation
 * of that size must not be p unless something waited for it.
 * `before_cache`: the stream exists before the context's first allocation
 * (the context's cache then starts outside the single sequence). */
typedef CUresult (*green_create_fn)(CUgreenCtx*, CUdevResourceDesc, CUdevice, unsigned);
typedef CUresult (*green_stream_fn)(CUstream*, CUgreenCtx, unsigned, int);
static int green_stream(int before_cache) {
  green_create_fn create = (green_create_fn)A->entry("cuGreenCtxCreate", 12040, 0, "cuGreenCtxCreate");
  green_stream_fn make = (green_stream_fn)A->entry("cuGreenCtxStreamCreate", 12050, 0, "cuGreenCtxStreamCreate");
  CHECK(create != NULL && make != NULL);
  CUgreenCtx green;
  CUstream s;
  CUdeviceptr p = 0, q = 0;
  if (!before_cache) CHECK_CU(A->mem_alloc(&p, MiB)); /* the context's cache exists: one sequence */
  CHECK_CU(create(&green, NULL, 0, 0));
  CHECK_CU(make(&s, green, CU_STREAM_NON_BLOCKING, 0));
  if (before_cache) CHECK_CU(A->mem_alloc(&p, MiB));
  CHECK_CU(A->launch_kernel(NULL, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL)); /* reads p */
  A->fake_hold(s, 1);
  const unsigned long waits = stats().event_sync, syncs = stats().ctx_sync;
  CHECK_CU(A->mem_free(p));
  CHECK_CU(A->mem_alloc(&q, MiB));
  CHECK(q != p || stats().event_sync > waits || stats().ctx_sync > syncs);
  A->fake_hold(s, 0);
  CHECK_CU(A->mem_free(q));
  return 0;
}
static int watch_green_stream(void) { return green_stream(0); }
static int watch_green_stream_before_cache(void) { return green_stream(1); }

static const struct {
  const char* name;
  behaviour_fn run;
} behaviours[] = {
  {"watch_late_plugin", watch_late_plugin},
  {"watch_green_stream", watch_green_stream},
  {"watch_green_stream_before_cache", watch_green_stream_before_cache},
  {"watch_memcpy_atod_ptds", watch_memcpy_atod_ptds},
  {"watch_memcpy_dtoa_ptds", watch_memcpy_dtoa_ptds},
  {"watch_batch_copy_12080_ptsz", watch_batch_copy_12080_ptsz},
  {"watch_batch_copy_13000_ptsz", watch_batch_copy_13000_ptsz},
  {"watch_wait_value_ptsz", watch_wait_value_ptsz},
  {"watch_decompress_ptsz", watch_decompress_ptsz},
  {"watch_grid_launch_per_thread_handle", watch_grid_launch_per_thread_handle},
  {"watch_unknown_ptsz", watch_unknown_ptsz},
  {"watch_unknown_plain", watch_unknown_plain},
  {"watch_new_abi_launch", watch_new_abi_launch},
  {"watch_unknown_one_thread_serial", watch_unknown_one_thread_serial},
};

behaviour_fn watch_behaviour(const char* name) {
  for (size_t i = 0; i < sizeof behaviours / sizeof behaviours[0]; ++i)
    if (strcmp(behaviours[i].name, name) == 0) return behaviours[i].run;
  return NULL;
}
