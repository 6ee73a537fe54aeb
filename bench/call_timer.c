/* call_timer.c — the time a program spends inside the driver's allocation
 * calls, measured in the program itself (bench/run-all.sh, issue 18).
 *
 * cachalloc reports its own time per call from its counters.  CUDA's
 * stream-ordered pool has no such counter, so the harness preloads this
 * object into the `cudapool` contender: the same program, the same
 * accounting (host time from entry to return of each allocation call), so
 * "at ≤ the pool's time per call" is a comparison within one run.
 *
 * It reaches the driver's entry points by bench/preload_route.h, as
 * bench/floor_preload.c does: it exports dlsym, hands back its own
 * cuGetProcAddress, and wraps
 * cuMemAlloc/cuMemFree (_v2 ABI), cuMemAllocAsync/cuMemFreeAsync and their
 * per-thread-default-stream variants.  Each wrapper calls the driver's
 * function and adds one call and its nanoseconds (CLOCK_MONOTONIC, two
 * vDSO reads) to process totals with relaxed atomics; nothing else changes.
 *
 * Read in-process: call_timer_read(out) fills {calls, ns_inside, frees}
 * (bench/programs/common.py's CallTimerCounters), and one line
 * `CALL_TIMER {...}` goes to stderr at exit.  A measuring tool only: not
 * part of cachalloc.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <time.h>

#include "preload_route.h"

#define EXPORT __attribute__((visibility("default")))

typedef CUresult (*alloc_fn)(CUdeviceptr*, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*alloc_async_fn)(CUdeviceptr*, size_t, CUstream);
typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);

/* The driver's functions (preload_route.h fills them). */
static void *real_alloc, *real_free, *real_alloc_async, *real_alloc_async_ptsz, *real_free_async,
    *real_free_async_ptsz;

/* Process totals.  Relaxed atomics: the figures are read between phases,
 * when no allocation call is in flight on the reading thread's behalf. */
static unsigned long long total_calls, total_ns, total_frees;

static unsigned long long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}

static void account(unsigned long long t0, int is_free) {
  const unsigned long long dt = now_ns() - t0;
  __atomic_fetch_add(&total_calls, 1, __ATOMIC_RELAXED);
  __atomic_fetch_add(&total_ns, dt, __ATOMIC_RELAXED);
  if (is_free) __atomic_fetch_add(&total_frees, 1, __ATOMIC_RELAXED);
}

/* ---- the timed wrappers ---------------------------------------------------- */

static CUresult timed_alloc(CUdeviceptr* d, size_t n) {
  if (real_alloc == NULL) return CUDA_ERROR_NOT_INITIALIZED;
  const unsigned long long t0 = now_ns();
  const CUresult r = ((alloc_fn)real_alloc)(d, n);
  account(t0, 0);
  return r;
}

static CUresult timed_free(CUdeviceptr p) {
  if (real_free == NULL) return CUDA_ERROR_NOT_INITIALIZED;
  const unsigned long long t0 = now_ns();
  const CUresult r = ((free_fn)real_free)(p);
  account(t0, 1);
  return r;
}

static CUresult timed_alloc_async_with(void* real, CUdeviceptr* d, size_t n, CUstream s) {
  if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
  const unsigned long long t0 = now_ns();
  const CUresult r = ((alloc_async_fn)real)(d, n, s);
  account(t0, 0);
  return r;
}

static CUresult timed_free_async_with(void* real, CUdeviceptr p, CUstream s) {
  if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
  const unsigned long long t0 = now_ns();
  const CUresult r = ((free_async_fn)real)(p, s);
  account(t0, 1);
  return r;
}

static CUresult timed_alloc_async(CUdeviceptr* d, size_t n, CUstream s) {
  return timed_alloc_async_with(real_alloc_async, d, n, s);
}
static CUresult timed_alloc_async_ptsz(CUdeviceptr* d, size_t n, CUstream s) {
  return timed_alloc_async_with(real_alloc_async_ptsz, d, n, s);
}
static CUresult timed_free_async(CUdeviceptr p, CUstream s) { return timed_free_async_with(real_free_async, p, s); }
static CUresult timed_free_async_ptsz(CUdeviceptr p, CUstream s) {
  return timed_free_async_with(real_free_async_ptsz, p, s);
}

/* ---- the route (preload_route.h) -------------------------------------------- */

static const struct route_hook* route_hooks(size_t* count) {
  static const struct route_hook hooks[] = {
      {"cuMemAlloc", 3020, -1, "cuMemAlloc_v2", &real_alloc, (void*)&timed_alloc},
      {"cuMemFree", 3020, -1, "cuMemFree_v2", &real_free, (void*)&timed_free},
      {"cuMemAllocAsync", 11020, 0, "cuMemAllocAsync", &real_alloc_async, (void*)&timed_alloc_async},
      {"cuMemAllocAsync", 11020, 1, "cuMemAllocAsync_ptsz", &real_alloc_async_ptsz, (void*)&timed_alloc_async_ptsz},
      {"cuMemFreeAsync", 11020, 0, "cuMemFreeAsync", &real_free_async, (void*)&timed_free_async},
      {"cuMemFreeAsync", 11020, 1, "cuMemFreeAsync_ptsz", &real_free_async_ptsz, (void*)&timed_free_async_ptsz},
  };
  *count = sizeof hooks / sizeof hooks[0];
  return hooks;
}

/* {calls, ns inside them, frees} so far. */
EXPORT void call_timer_read(unsigned long long out[3]) {
  out[0] = __atomic_load_n(&total_calls, __ATOMIC_RELAXED);
  out[1] = __atomic_load_n(&total_ns, __ATOMIC_RELAXED);
  out[2] = __atomic_load_n(&total_frees, __ATOMIC_RELAXED);
}

__attribute__((destructor)) static void call_timer_report(void) {
  unsigned long long t[3];
  call_timer_read(t);
  fprintf(stderr, "CALL_TIMER {\"calls\":%llu,\"ns_inside\":%llu,\"frees\":%llu}\n", t[0], t[1], t[2]);
}
