// runtime_entry_points.cpp — cudaMalloc & co. for shared-cudart programs.
//
// A program (or library such as libtorch_cuda) linked against libcudart.so
// resolves cudaMalloc to this export first.  Serving the request here skips
// cudart's own layers around the driver call.  Whether the cache serves is
// decided in driver_ops.h (the runtime route), as for every other route:
// this file only translates, cudaSuccess for a served call, else the real
// cudart function, so cudart's last-error state and error codes stay
// exactly right (an error from the cache is then reproduced by cudart,
// which reaches the driver through the hooked cuGetProcAddress route).
// Static-cudart binaries never call these (their cudaMalloc is internal);
// they are caught on the driver route.  Built only with -Druntime_hooks=true.
#include <dlfcn.h>
#include <link.h>

#include <cstring>

#include <cuda_runtime_api.h>

#include "driver_ops.h"
#include "guarded.h"
#include "host_ops.h"
#include "process_state.h"
#include "start_up.h"
#include "real_driver.h"

using namespace cachalloc;
using namespace cachalloc::shim;

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace {

// libcudart as loaded by the process: the next definition after ours, or,
// when cudart was dlopen'ed locally (Python extensions), the loaded object
// whose name contains "libcudart" (wheels may add a hash).
int find_cudart(struct dl_phdr_info* info, size_t, void* out) {
  if (info->dlpi_name != nullptr && std::strstr(info->dlpi_name, "libcudart") != nullptr) {
    *static_cast<void**>(out) = dlopen(info->dlpi_name, RTLD_NOLOAD | RTLD_LAZY);
    return *static_cast<void**>(out) != nullptr;
  }
  return 0;
}

template <typename Fn>
Fn real_cudart(const char* name) {
  void* sym = real_dlsym(RTLD_NEXT, name);
  if (sym == nullptr) {
    void* handle = nullptr;
    dl_iterate_phdr(find_cudart, &handle);
    if (handle != nullptr) sym = real_dlsym(handle, name);
  }
  return reinterpret_cast<Fn>(sym);
}

#define REAL_CUDART(fn) \
  static const auto real_##fn = real_cudart<decltype(&::fn)>(#fn)

// What a RuntimeAnswer (driver_ops.h) means here: served, cudaSuccess;
// else cudart's own function (`fallback`) runs, under RepeatOomGuard when
// the cache ran out of memory, so that cudart reproduces the error and its
// last-error state without a second retry path or OOM report.  An
// exception of the cache's counts as not served.
template <typename Decide, typename Fallback>
cudaError_t served_or(Decide&& decide, Fallback&& fallback) noexcept {
  const RuntimeAnswer a = guarded(RuntimeAnswer::pass, std::forward<Decide>(decide));
  if (a == RuntimeAnswer::served) [[likely]] return cudaSuccess;
  if (a == RuntimeAnswer::pass_out_of_memory) {
    RepeatOomGuard guard;
    return fallback();
  }
  return fallback();
}

}  // namespace

EXPORT cudaError_t cudaMalloc(void** devPtr, size_t size) {
  CACHALLOC_ENTRY(cudaMalloc);
  return served_or([&] { return runtime_malloc(devPtr, size); },
                   [&] {
                     REAL_CUDART(cudaMalloc);
                     return real_cudaMalloc ? real_cudaMalloc(devPtr, size) : cudaErrorInitializationError;
                   });
}

EXPORT cudaError_t cudaFree(void* devPtr) {
  CACHALLOC_ENTRY(cudaFree);
  return served_or([&] { return runtime_free(devPtr); },
                   [&] {
                     REAL_CUDART(cudaFree);
                     return real_cudaFree ? real_cudaFree(devPtr) : cudaErrorInitializationError;
                   });
}

EXPORT cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t stream) {
  CACHALLOC_ENTRY(cudaMallocAsync);
  return served_or([&] { return runtime_malloc_async(devPtr, size, reinterpret_cast<CUstream>(stream), false); }, [&] {
    REAL_CUDART(cudaMallocAsync);
    return real_cudaMallocAsync ? real_cudaMallocAsync(devPtr, size, stream) : cudaErrorInitializationError;
  });
}

EXPORT cudaError_t cudaMallocAsync_ptsz(void** devPtr, size_t size, cudaStream_t stream) {
  CACHALLOC_ENTRY(cudaMallocAsync);
  return served_or([&] { return runtime_malloc_async(devPtr, size, reinterpret_cast<CUstream>(stream), true); }, [&] {
    REAL_CUDART(cudaMallocAsync_ptsz);
    return real_cudaMallocAsync_ptsz ? real_cudaMallocAsync_ptsz(devPtr, size, stream) : cudaErrorInitializationError;
  });
}

EXPORT cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t stream) {
  CACHALLOC_ENTRY(cudaFreeAsync);
  return served_or([&] { return runtime_free_async(devPtr, reinterpret_cast<CUstream>(stream), false); }, [&] {
    REAL_CUDART(cudaFreeAsync);
    return real_cudaFreeAsync ? real_cudaFreeAsync(devPtr, stream) : cudaErrorInitializationError;
  });
}

EXPORT cudaError_t cudaFreeAsync_ptsz(void* devPtr, cudaStream_t stream) {
  CACHALLOC_ENTRY(cudaFreeAsync);
  return served_or([&] { return runtime_free_async(devPtr, reinterpret_cast<CUstream>(stream), true); }, [&] {
    REAL_CUDART(cudaFreeAsync_ptsz);
    return real_cudaFreeAsync_ptsz ? real_cudaFreeAsync_ptsz(devPtr, stream) : cudaErrorInitializationError;
  });
}

// The driver route (hooked) computes the cache-aware numbers; cudart only
// adds its error bookkeeping, so this one always goes through cudart.
EXPORT cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  CACHALLOC_ENTRY(cudaMemGetInfo);
  REAL_CUDART(cudaMemGetInfo);
  return real_cudaMemGetInfo ? real_cudaMemGetInfo(free, total) : cudaErrorInitializationError;
}

// ---- pinned host memory (host_ops.h): served by the host cache when a
// context is current; everything else, errors included, is cudart's own
// path, which reaches the hooked driver calls.

EXPORT cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int flags) {
  if (guarded(kNotOwned, [&] { return host_cache_alloc(pHost, size, flags); }) == kSuccess) return cudaSuccess;
  REAL_CUDART(cudaHostAlloc);
  return real_cudaHostAlloc ? real_cudaHostAlloc(pHost, size, flags) : cudaErrorInitializationError;
}

EXPORT cudaError_t cudaMallocHost(void** ptr, size_t size) {
  if (guarded(kNotOwned, [&] { return host_cache_alloc(ptr, size, 0); }) == kSuccess) return cudaSuccess;
  REAL_CUDART(cudaMallocHost);
  return real_cudaMallocHost ? real_cudaMallocHost(ptr, size) : cudaErrorInitializationError;
}

// A double free or interior pointer goes to cudart too: its cuMemFreeHost
// (hooked) refuses it, and cudart sets its last error as without cachalloc.
EXPORT cudaError_t cudaFreeHost(void* ptr) {
  if (guarded(false, [&] { return host_cache_free(ptr) == kSuccess; })) return cudaSuccess;
  REAL_CUDART(cudaFreeHost);
  return real_cudaFreeHost ? real_cudaFreeHost(ptr) : cudaErrorInitializationError;
}
