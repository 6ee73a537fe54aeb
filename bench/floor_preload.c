/* floor_preload.c — the floor of bench/run-all.sh (issue 8): what cudart
 * itself costs around a driver allocation call that does (almost) nothing.
 *
 * An LD_PRELOAD object that reaches the driver's allocation entry points the
 * way cachalloc does (shim/dlsym_hook.cpp, shim/proc_address_hook.cpp), in a
 * minimal form:
 *   - it exports dlsym; a lookup of cuGetProcAddress_v2 / cuGetProcAddress
 *     (cudart: dlopen("libcuda.so.1") then dlsym of cuGetProcAddress_v2)
 *     returns this file's wrapper, as does a direct dlsym of the allocation
 *     functions themselves;
 *   - the cuGetProcAddress wrapper asks the driver, then hands back its own
 *     wrapper for "cuGetProcAddress" (the v2 signature from version 12000)
 *     and for cuMemAlloc/cuMemFree (version >= 3020, the _v2 ABI) and
 *     cuMemAllocAsync/cuMemFreeAsync (per-thread-default-stream variants
 *     when the flags ask for them).
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
#include <cuda.h>
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

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
    real_free(plain_slot.ptr);
    plain_slot.ptr = 0;
  }
  CUresult r = real_alloc(dptr, size);
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
  return real_free ? real_free(p) : CUDA_ERROR_NOT_INITIALIZED;
}

static CUresult async_alloc(alloc_async_fn real, free_async_fn real_release, CUdeviceptr* dptr, size_t size,
                            CUstream s) {
  if (async_slot.ptr && !async_slot.used && async_slot.size == size) {
    async_slot.used = 1;
    *dptr = async_slot.ptr;
    count(&t_hits[1], &hits[1]);
    return CUDA_SUCCESS;
  }
  count(&t_misses[1], &misses[1]);
  if (real == NULL || real_release == NULL) return CUDA_ERROR_NOT_INITIALIZED;
  if (async_slot.ptr && !async_slot.used) {
    real_release(async_slot.ptr, s);
    async_slot.ptr = 0;
  }
  CUresult r = real(dptr, size, s);
  if (r == CUDA_SUCCESS && !async_slot.ptr) {
    async_slot.ptr = *dptr;
    async_slot.size = size;
    async_slot.used = 1;
  }
  return r;
}

static CUresult async_free(free_async_fn real, CUdeviceptr p, CUstream s) {
  if (p && p == async_slot.ptr && async_slot.used) {
    async_slot.used = 0;
    return CUDA_SUCCESS;
  }
  return real ? real(p, s) : CUDA_ERROR_NOT_INITIALIZED;
}

static CUresult floor_alloc_async(CUdeviceptr* d, size_t n, CUstream s) {
  return async_alloc(real_alloc_async, real_free_async, d, n, s);
}
static CUresult floor_alloc_async_ptsz(CUdeviceptr* d, size_t n, CUstream s) {
  return async_alloc(real_alloc_async_ptsz, real_free_async_ptsz, d, n, s);
}
static CUresult floor_free_async(CUdeviceptr p, CUstream s) { return async_free(real_free_async, p, s); }
static CUresult floor_free_async_ptsz(CUdeviceptr p, CUstream s) { return async_free(real_free_async_ptsz, p, s); }

/* ---- the route: cuGetProcAddress and dlsym -------------------------------- */

static CUresult floor_gpa2(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
static CUresult floor_gpa1(const char*, void**, int, cuuint64_t);

/* Swaps *pfn (the driver's answer for `symbol`) for a wrapper, remembering
 * the driver's function. */
static void redirect(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  const int ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  if (strcmp(symbol, "cuGetProcAddress") == 0) {
    if (version >= 12000) {
      real_gpa2 = (gpa2_fn)*pfn;
      *pfn = (void*)&floor_gpa2;
    } else {
      real_gpa1 = (gpa1_fn)*pfn;
      *pfn = (void*)&floor_gpa1;
    }
  } else if (version >= 3020 && strcmp(symbol, "cuMemAlloc") == 0) {
    real_alloc = (alloc_fn)*pfn;
    *pfn = (void*)&floor_mem_alloc;
  } else if (version >= 3020 && strcmp(symbol, "cuMemFree") == 0) {
    real_free = (free_fn)*pfn;
    *pfn = (void*)&floor_mem_free;
  } else if (version >= 11020 && strcmp(symbol, "cuMemAllocAsync") == 0) {
    if (ptsz) {
      real_alloc_async_ptsz = (alloc_async_fn)*pfn;
      *pfn = (void*)&floor_alloc_async_ptsz;
    } else {
      real_alloc_async = (alloc_async_fn)*pfn;
      *pfn = (void*)&floor_alloc_async;
    }
  } else if (version >= 11020 && strcmp(symbol, "cuMemFreeAsync") == 0) {
    if (ptsz) {
      real_free_async_ptsz = (free_async_fn)*pfn;
      *pfn = (void*)&floor_free_async_ptsz;
    } else {
      real_free_async = (free_async_fn)*pfn;
      *pfn = (void*)&floor_free_async;
    }
  }
}

static CUresult floor_gpa2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                           CUdriverProcAddressQueryResult* status) {
  CUresult r = real_gpa2(symbol, pfn, version, flags, status);
  if (r == CUDA_SUCCESS && symbol && pfn && *pfn) redirect(symbol, pfn, version, flags);
  return r;
}

static CUresult floor_gpa1(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  CUresult r = real_gpa1(symbol, pfn, version, flags);
  if (r == CUDA_SUCCESS && symbol && pfn && *pfn) redirect(symbol, pfn, version, flags);
  return r;
}

static dlsym_fn resolve_real_dlsym(void) {
  dlsym_fn fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (fn == NULL) fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  return fn;
}

EXPORT void* dlsym(void* __restrict handle, const char* __restrict name) {
  if (real_dlsym == NULL) real_dlsym = resolve_real_dlsym();
  if (real_dlsym == NULL) return NULL;
  if (name[0] != 'c' || name[1] != 'u') return real_dlsym(handle, name);
  void* sym = real_dlsym(handle, name);
  if (sym == NULL) return NULL;
  if (strcmp(name, "cuGetProcAddress_v2") == 0) {
    real_gpa2 = (gpa2_fn)sym;
    return (void*)&floor_gpa2;
  }
  if (strcmp(name, "cuGetProcAddress") == 0) {
    real_gpa1 = (gpa1_fn)sym;
    return (void*)&floor_gpa1;
  }
  if (strcmp(name, "cuMemAlloc_v2") == 0) {
    real_alloc = (alloc_fn)sym;
    return (void*)&floor_mem_alloc;
  }
  if (strcmp(name, "cuMemFree_v2") == 0) {
    real_free = (free_fn)sym;
    return (void*)&floor_mem_free;
  }
  if (strcmp(name, "cuMemAllocAsync") == 0) {
    real_alloc_async = (alloc_async_fn)sym;
    return (void*)&floor_alloc_async;
  }
  if (strcmp(name, "cuMemAllocAsync_ptsz") == 0) {
    real_alloc_async_ptsz = (alloc_async_fn)sym;
    return (void*)&floor_alloc_async_ptsz;
  }
  if (strcmp(name, "cuMemFreeAsync") == 0) {
    real_free_async = (free_async_fn)sym;
    return (void*)&floor_free_async;
  }
  if (strcmp(name, "cuMemFreeAsync_ptsz") == 0) {
    real_free_async_ptsz = (free_async_fn)sym;
    return (void*)&floor_free_async_ptsz;
  }
  return sym;
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
