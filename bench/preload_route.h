/* preload_route.h — how bench's measuring preloads (floor_preload.c,
 * call_timer.c) get between cudart and the driver's allocation calls: the
 * route of cachalloc's shim/dlsym_hook.cpp and shim/proc_address_hook.cpp,
 * in a minimal form.
 *
 *   - The object exports dlsym.  cudart opens libcuda.so.1 and looks up
 *     cuGetProcAddress_v2 with dlsym; the lookup gets route_gpa2, and a
 *     direct lookup of a hooked function gets its wrapper.
 *   - route_gpa2 / route_gpa1 ask the driver, then hand back the wrapper for
 *     a hooked symbol (and themselves for "cuGetProcAddress"), remembering
 *     the driver's function.  Versions and flags pick the entry: the _v2 ABI
 *     of cuMemAlloc/cuMemFree from 3020, the async calls from 11020, their
 *     per-thread-default-stream variants when the flags ask for them.
 *
 * The includer includes this file once, then defines its wrappers, the
 * slots (`void*`) holding the driver's functions they call, and
 * route_hooks(), which returns its table of struct route_hook naming them.  A lookup with RTLD_NEXT through this dlsym resolves
 * relative to the preload: these objects only measure, never use them for
 * anything else.
 */
#ifndef CACHALLOC_BENCH_PRELOAD_ROUTE_H
#define CACHALLOC_BENCH_PRELOAD_ROUTE_H

#include <cuda.h>
#include <dlfcn.h>
#include <stddef.h>
#include <string.h>

/* One hooked entry point: its name for cuGetProcAddress (`symbol`, from
 * `min_version`, `ptsz` for the per-thread-default-stream variant) and for a
 * direct dlsym (`direct`); where the driver's function goes; what is handed
 * back instead.  ptsz: 1 the per-thread-default-stream entry, 0 the other,
 * -1 either (calls that take no stream). */
struct route_hook {
  const char* symbol;
  int min_version;
  int ptsz;
  const char* direct;
  void** real;
  void* wrapper;
};

/* The includer's table (defined after its wrappers). */
static const struct route_hook* route_hooks(size_t* count);

typedef void* (*route_dlsym_fn)(void*, const char*);
typedef CUresult (*route_gpa2_fn)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
typedef CUresult (*route_gpa1_fn)(const char*, void**, int, cuuint64_t);

static route_dlsym_fn route_real_dlsym;
static route_gpa2_fn route_real_gpa2;
static route_gpa1_fn route_real_gpa1;

static CUresult route_gpa2(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
static CUresult route_gpa1(const char*, void**, int, cuuint64_t);

/* Swaps *pfn (the driver's answer for `symbol`) for a wrapper, remembering
 * the driver's function. */
static void route_redirect(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  const int ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  if (strcmp(symbol, "cuGetProcAddress") == 0) {
    if (version >= 12000) {
      route_real_gpa2 = (route_gpa2_fn)*pfn;
      *pfn = (void*)&route_gpa2;
    } else {
      route_real_gpa1 = (route_gpa1_fn)*pfn;
      *pfn = (void*)&route_gpa1;
    }
    return;
  }
  size_t n;
  const struct route_hook* hooks = route_hooks(&n);
  for (size_t i = 0; i < n; ++i) {
    const struct route_hook* h = &hooks[i];
    if (version >= h->min_version && (h->ptsz < 0 || h->ptsz == ptsz) && strcmp(symbol, h->symbol) == 0) {
      *h->real = *pfn;
      *pfn = h->wrapper;
      return;
    }
  }
}

static CUresult route_gpa2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                           CUdriverProcAddressQueryResult* status) {
  CUresult r = route_real_gpa2(symbol, pfn, version, flags, status);
  if (r == CUDA_SUCCESS && symbol && pfn && *pfn) route_redirect(symbol, pfn, version, flags);
  return r;
}

static CUresult route_gpa1(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  CUresult r = route_real_gpa1(symbol, pfn, version, flags);
  if (r == CUDA_SUCCESS && symbol && pfn && *pfn) route_redirect(symbol, pfn, version, flags);
  return r;
}

static route_dlsym_fn route_resolve_real_dlsym(void) {
  route_dlsym_fn fn = (route_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (fn == NULL) fn = (route_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  return fn;
}

__attribute__((visibility("default"))) void* dlsym(void* __restrict handle, const char* __restrict name) {
  if (route_real_dlsym == NULL) route_real_dlsym = route_resolve_real_dlsym();
  if (route_real_dlsym == NULL) return NULL;
  if (name[0] != 'c' || name[1] != 'u') return route_real_dlsym(handle, name);
  void* sym = route_real_dlsym(handle, name);
  if (sym == NULL) return NULL;
  if (strcmp(name, "cuGetProcAddress_v2") == 0) {
    route_real_gpa2 = (route_gpa2_fn)sym;
    return (void*)&route_gpa2;
  }
  if (strcmp(name, "cuGetProcAddress") == 0) {
    route_real_gpa1 = (route_gpa1_fn)sym;
    return (void*)&route_gpa1;
  }
  size_t n;
  const struct route_hook* hooks = route_hooks(&n);
  for (size_t i = 0; i < n; ++i) {
    if (strcmp(name, hooks[i].direct) == 0) {
      *hooks[i].real = sym;
      return hooks[i].wrapper;
    }
  }
  return sym;
}

#endif
