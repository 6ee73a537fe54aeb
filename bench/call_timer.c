/* call_timer.c — the time a program spends inside the driver's allocation
 * calls, measured in the program itself (bench/run-all.sh, issue 18).
 *
 * cachalloc reports its own time per call from its counters.  CUDA's
 * stream-ordered pool has no such counter, so the harness preloads this
 * object into the `cudapool` contender: the same program, the same
 * accounting (host time from entry to return of each allocation call), so
 * "at ≤ the pool's time per call" is a comparison within one run.
 *
 * It reaches the driver's entry points the way bench/floor_preload.c does
 * (the route of cachalloc's shim/dlsym_hook.cpp in a minimal form): it
 * exports dlsym, hands back its own cuGetProcAddress, and wraps
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
#include <cuda.h>
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

typedef void* (*dlsym_fn)(void*, const char*);
typedef CUresult (*gpa2_fn)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
typedef CUresult (*gpa1_fn)(const char*, void**, int, cuuint64_t);
typedef CUresult (*alloc_fn)(CUdeviceptr*, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*alloc_async_fn)(CUdeviceptr*, size_t, CUstream);
typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);

static dlsym_fn real_dlsym;
static gpa2_fn real_gpa2;
static gpa1_fn real_gpa1;
static alloc_fn real_alloc;
static free_fn real_free;
static alloc_async_fn real_alloc_async, real_alloc_async_ptsz;
static free_async_fn real_free_async, real_free_async_ptsz;

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
  const CUresult r = real_alloc(d, n);
  account(t0, 0);
  return r;
}

static CUresult timed_free(CUdeviceptr p) {
  if (real_free == NULL) return CUDA_ERROR_NOT_INITIALIZED;
  const unsigned long long t0 = now_ns();
  const CUresult r = real_free(p);
  account(t0, 1);
  return r;
}

static CUresult timed_alloc_async_with(alloc_async_fn real, CUdeviceptr* d, size_t n, CUstream s) {
  if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
  const unsigned long long t0 = now_ns();
  const CUresult r = real(d, n, s);
  account(t0, 0);
  return r;
}

static CUresult timed_free_async_with(free_async_fn real, CUdeviceptr p, CUstream s) {
  if (real == NULL) return CUDA_ERROR_NOT_INITIALIZED;
  const unsigned long long t0 = now_ns();
  const CUresult r = real(p, s);
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

/* ---- the route: cuGetProcAddress and dlsym ---------------------------------- */

static CUresult timer_gpa2(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
static CUresult timer_gpa1(const char*, void**, int, cuuint64_t);

/* Swaps *pfn (the driver's answer for `symbol`) for a wrapper, remembering
 * the driver's function. */
static void redirect(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  const int ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  if (strcmp(symbol, "cuGetProcAddress") == 0) {
    if (version >= 12000) {
      real_gpa2 = (gpa2_fn)*pfn;
      *pfn = (void*)&timer_gpa2;
    } else {
      real_gpa1 = (gpa1_fn)*pfn;
      *pfn = (void*)&timer_gpa1;
    }
  } else if (version >= 3020 && strcmp(symbol, "cuMemAlloc") == 0) {
    real_alloc = (alloc_fn)*pfn;
    *pfn = (void*)&timed_alloc;
  } else if (version >= 3020 && strcmp(symbol, "cuMemFree") == 0) {
    real_free = (free_fn)*pfn;
    *pfn = (void*)&timed_free;
  } else if (version >= 11020 && strcmp(symbol, "cuMemAllocAsync") == 0) {
    if (ptsz) {
      real_alloc_async_ptsz = (alloc_async_fn)*pfn;
      *pfn = (void*)&timed_alloc_async_ptsz;
    } else {
      real_alloc_async = (alloc_async_fn)*pfn;
      *pfn = (void*)&timed_alloc_async;
    }
  } else if (version >= 11020 && strcmp(symbol, "cuMemFreeAsync") == 0) {
    if (ptsz) {
      real_free_async_ptsz = (free_async_fn)*pfn;
      *pfn = (void*)&timed_free_async_ptsz;
    } else {
      real_free_async = (free_async_fn)*pfn;
      *pfn = (void*)&timed_free_async;
    }
  }
}

static CUresult timer_gpa2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                           CUdriverProcAddressQueryResult* status) {
  CUresult r = real_gpa2(symbol, pfn, version, flags, status);
  if (r == CUDA_SUCCESS && symbol && pfn && *pfn) redirect(symbol, pfn, version, flags);
  return r;
}

static CUresult timer_gpa1(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  CUresult r = real_gpa1(symbol, pfn, version, flags);
  if (r == CUDA_SUCCESS && symbol && pfn && *pfn) redirect(symbol, pfn, version, flags);
  return r;
}

static dlsym_fn resolve_real_dlsym(void) {
  dlsym_fn fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (fn == NULL) fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  return fn;
}

/* The driver's function for a direct dlsym of `name`, and this file's
 * wrapper in its place; NULL for names not wrapped. */
static void* wrap_direct(const char* name, void* sym) {
  static const struct {
    const char* name;
    void** real;
    void* wrapper;
  } table[] = {
      {"cuGetProcAddress_v2", (void**)&real_gpa2, (void*)&timer_gpa2},
      {"cuGetProcAddress", (void**)&real_gpa1, (void*)&timer_gpa1},
      {"cuMemAlloc_v2", (void**)&real_alloc, (void*)&timed_alloc},
      {"cuMemFree_v2", (void**)&real_free, (void*)&timed_free},
      {"cuMemAllocAsync", (void**)&real_alloc_async, (void*)&timed_alloc_async},
      {"cuMemAllocAsync_ptsz", (void**)&real_alloc_async_ptsz, (void*)&timed_alloc_async_ptsz},
      {"cuMemFreeAsync", (void**)&real_free_async, (void*)&timed_free_async},
      {"cuMemFreeAsync_ptsz", (void**)&real_free_async_ptsz, (void*)&timed_free_async_ptsz},
  };
  for (size_t i = 0; i < sizeof table / sizeof table[0]; ++i) {
    if (strcmp(name, table[i].name) == 0) {
      *table[i].real = sym;
      return table[i].wrapper;
    }
  }
  return NULL;
}

EXPORT void* dlsym(void* __restrict handle, const char* __restrict name) {
  if (real_dlsym == NULL) real_dlsym = resolve_real_dlsym();
  if (real_dlsym == NULL) return NULL;
  if (name[0] != 'c' || name[1] != 'u') return real_dlsym(handle, name);
  void* sym = real_dlsym(handle, name);
  if (sym == NULL) return NULL;
  void* wrapper = wrap_direct(name, sym);
  return wrapper ? wrapper : sym;
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
