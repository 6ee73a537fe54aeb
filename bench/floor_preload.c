/* floor_preload.c — the floor of bench/run-all.sh (issue 8): what cudart
 * itself costs around a driver allocation call that does (almost) nothing.
 *
 * An LD_PRELOAD object that reaches the driver's allocation entry points the
 * way cachalloc does, through bench/preload_route.h (the minimal form of
 * shim/dlsym_hook.cpp and shim/proc_address_hook.cpp): cuMemAlloc/cuMemFree
 * (the _v2 ABI) and cuMemAllocAsync/cuMemFreeAsync (per-thread-default-stream
 * variants when the flags ask for them).
 *
 * Allocation is served from ONE remembered pointer of ONE size per path
 * (plain and async): a request of the slot's size while the slot is free
 * gets the slot; a free of the slot's pointer marks it free.  Anything else
 * goes to the driver (a miss while the slot is free first returns the old
 * slot to the driver and adopts the new allocation).
 *
 * The slots are per thread (initial-exec TLS: no lock, no atomic, nothing
 * shared), so the floor is also the ceiling of the threads group: what
 * cudart and the driver allow when the cache itself costs nothing and
 * shares nothing.  The stream argument of the async calls is ignored, and a
 * lookup with RTLD_NEXT through this dlsym resolves relative to this
 * object.  Never use it for anything but measuring the floor.
 */
#define _GNU_SOURCE
#include <stdio.h>

#include "preload_route.h"

typedef CUresult (*alloc_fn)(CUdeviceptr*, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*alloc_async_fn)(CUdeviceptr*, size_t, CUstream);
typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);

/* The driver's functions (preload_route.h fills them). */
static void *real_alloc, *real_free, *real_alloc_async, *real_alloc_async_ptsz, *real_free_async,
    *real_free_async_ptsz;

struct slot {
  CUdeviceptr ptr;
  size_t size;
  int used;
};
#define TLS __thread __attribute__((tls_model("initial-exec")))
static TLS struct slot plain_slot, async_slot;
/* [0] plain, [1] async.  Counted per thread and folded into the process
 * totals every FOLD events (one shared atomic per event would itself stop
 * the threads scaling); the main thread's remainder is added at exit, other
 * threads' remainders (< FOLD each) are not: the totals only show that the
 * floor was in the path. */
#define FOLD 1024
static TLS unsigned long t_hits[2], t_misses[2];
static unsigned long hits[2], misses[2];

static void count(unsigned long* mine, unsigned long* total) {
  if (++*mine == FOLD) {
    __atomic_fetch_add(total, FOLD, __ATOMIC_RELAXED);
    *mine = 0;
  }
}

/* ---- the one-slot cache -------------------------------------------------- */

static CUresult floor_mem_alloc(CUdeviceptr* dptr, size_t size) {
  if (plain_slot.ptr && !plain_slot.used && plain_slot.size == size) {
    plain_slot.used = 1;
    *dptr = plain_slot.ptr;
    count(&t_hits[0], &hits[0]);
    return CUDA_SUCCESS;
  }
  count(&t_misses[0], &misses[0]);
  if (real_alloc == NULL || real_free == NULL) return CUDA_ERROR_NOT_INITIALIZED;
  if (plain_slot.ptr && !plain_slot.used) {
    ((free_fn)real_free)(plain_slot.ptr);
    plain_slot.ptr = 0;
  }
  CUresult r = ((alloc_fn)real_alloc)(dptr, size);
  if (r == CUDA_SUCCESS && !plain_slot.ptr) {
    plain_slot.ptr = *dptr;
    plain_slot.size = size;
    plain_slot.used = 1;
  }
  return r;
}

static CUresult floor_mem_free(CUdeviceptr p) {
  if (p && p == plain_slot.ptr && plain_slot.used) {
    plain_slot.used = 0;
    return CUDA_SUCCESS;
  }
  return real_free ? ((free_fn)real_free)(p) : CUDA_ERROR_NOT_INITIALIZED;
}

static CUresult async_alloc(void* real, void* real_release, CUdeviceptr* dptr, size_t size, CUstream s) {
  if (async_slot.ptr && !async_slot.used && async_slot.size == size) {
    async_slot.used = 1;
    *dptr = async_slot.ptr;
    count(&t_hits[1], &hits[1]);
    return CUDA_SUCCESS;
  }
  count(&t_misses[1], &misses[1]);
  if (real == NULL || real_release == NULL) return CUDA_ERROR_NOT_INITIALIZED;
  if (async_slot.ptr && !async_slot.used) {
    ((free_async_fn)real_release)(async_slot.ptr, s);
    async_slot.ptr = 0;
  }
  CUresult r = ((alloc_async_fn)real)(dptr, size, s);
  if (r == CUDA_SUCCESS && !async_slot.ptr) {
    async_slot.ptr = *dptr;
    async_slot.size = size;
    async_slot.used = 1;
  }
  return r;
}

static CUresult async_free(void* real, CUdeviceptr p, CUstream s) {
  if (p && p == async_slot.ptr && async_slot.used) {
    async_slot.used = 0;
    return CUDA_SUCCESS;
  }
  return real ? ((free_async_fn)real)(p, s) : CUDA_ERROR_NOT_INITIALIZED;
}

static CUresult floor_alloc_async(CUdeviceptr* d, size_t n, CUstream s) {
  return async_alloc(real_alloc_async, real_free_async, d, n, s);
}
static CUresult floor_alloc_async_ptsz(CUdeviceptr* d, size_t n, CUstream s) {
  return async_alloc(real_alloc_async_ptsz, real_free_async_ptsz, d, n, s);
}
static CUresult floor_free_async(CUdeviceptr p, CUstream s) { return async_free(real_free_async, p, s); }
static CUresult floor_free_async_ptsz(CUdeviceptr p, CUstream s) { return async_free(real_free_async_ptsz, p, s); }

/* ---- the route (preload_route.h) -------------------------------------------- */

static const struct route_hook* route_hooks(size_t* count) {
  static const struct route_hook hooks[] = {
      {"cuMemAlloc", 3020, -1, "cuMemAlloc_v2", &real_alloc, (void*)&floor_mem_alloc},
      {"cuMemFree", 3020, -1, "cuMemFree_v2", &real_free, (void*)&floor_mem_free},
      {"cuMemAllocAsync", 11020, 0, "cuMemAllocAsync", &real_alloc_async, (void*)&floor_alloc_async},
      {"cuMemAllocAsync", 11020, 1, "cuMemAllocAsync_ptsz", &real_alloc_async_ptsz, (void*)&floor_alloc_async_ptsz},
      {"cuMemFreeAsync", 11020, 0, "cuMemFreeAsync", &real_free_async, (void*)&floor_free_async},
      {"cuMemFreeAsync", 11020, 1, "cuMemFreeAsync_ptsz", &real_free_async_ptsz, (void*)&floor_free_async_ptsz},
  };
  *count = sizeof hooks / sizeof hooks[0];
  return hooks;
}

/* So a run can check that the floor was in the path: what the slots served,
 * one line on stderr at exit (run_bench.py records it). */
__attribute__((destructor)) static void floor_report(void) {
  for (int i = 0; i < 2; ++i) {
    hits[i] += t_hits[i];
    misses[i] += t_misses[i];
  }
  fprintf(stderr, "FLOOR {\"plain_hits\":%lu,\"plain_misses\":%lu,\"async_hits\":%lu,\"async_misses\":%lu}\n",
          hits[0], misses[0], hits[1], misses[1]);
}
