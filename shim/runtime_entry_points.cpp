// runtime_entry_points.cpp — cudaMalloc & co. for shared-cudart programs.
//
// A program (or library such as libtorch_cuda) linked against libcudart.so
// resolves cudaMalloc to this export first.  Serving the request here skips
// cudart's own layers around the driver call.  It is done only where that is
// safe: a context must be current (else cudart's lazy initialization must
// run) and the cache must succeed; on anything else the call goes to the
// real cudart function, so cudart's last-error state and error codes stay
// exactly right (an error from the cache is then reproduced by cudart,
// which reaches the driver through the hooked cuGetProcAddress route).
// Static-cudart binaries never call these (their cudaMalloc is internal);
// they are caught on the driver route.  Built only with -Druntime_hooks=true.
#include <dlfcn.h>
#include <link.h>

#include <cstring>

#include <cuda_runtime_api.h>

#include "capture_tracking.h"
#include "context_registry.h"
#include "driver_ops.h"
#include "free_policy.h"
#include "guarded.h"
#include "host_ops.h"
#include "process_state.h"
#include "real_driver.h"
#include "stream_ids.h"
#include "tags.h"

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

// The current context's state when the cache may serve, else nullptr.
ContextState* serving_context() {
  if (!serving(current_mode())) return nullptr;
  return current_context_state();
}

// kSuccess when the cache served; otherwise the caller asks cudart.
// During a graph capture cudart is asked: it reaches the hooked driver
// calls, which hold or refuse as the driver would (capture_owned.h), and
// keeps its own error state exact.  Likewise for the frees below.
Status try_alloc(void** out, size_t size, StreamId stream) {
  if (out == nullptr || size == 0) return kInvalidValue;
  if (capture_in_flight()) [[unlikely]] return kNotOwned;
  ContextState* ctx = serving_context();
  if (ctx == nullptr) return kNotOwned;
  settle_deferred_frees(*ctx);
  DevicePtr p = 0;
  Status s = tagged_malloc(ctx->allocator(), &p, size, stream);
  if (s == kSuccess) *out = reinterpret_cast<void*>(p);
  return s;
}

bool try_free(void* ptr) {
  ContextState* ctx = ptr != nullptr && !capture_in_flight() ? serving_context() : nullptr;
  if (ctx == nullptr) return false;
  auto p = reinterpret_cast<DevicePtr>(ptr);
  return free_by_rule(*ctx, p, choose_free_rule(ctx->free_sync(), *ctx)) == kSuccess;
}

Status try_alloc_async(void** out, size_t size, cudaStream_t s, bool ptsz) {
  auto cs = reinterpret_cast<CUstream>(s);
  if (stream_is_capturing(cs, ptsz)) return kNotOwned;
  ContextState* ctx = serving_context();
  if (ctx == nullptr || !serve_async_on(*ctx, cs, ptsz)) return kNotOwned;
  return try_alloc(out, size, stream_id(cs, ptsz));
}

// A capture in flight on `s`: cudart's own path (the hooked cuMemFreeAsync)
// gives the driver's answer.
bool try_free_async(void* ptr, cudaStream_t s, bool ptsz) {
  ContextState* ctx = ptr != nullptr && !capture_in_flight() ? serving_context() : nullptr;
  if (ctx == nullptr) return false;
  auto p = reinterpret_cast<DevicePtr>(ptr);
  const StreamId id = stream_id(reinterpret_cast<CUstream>(s), ptsz);
  ctx->note_stream(id, false);  // blocking or not, this free waits on `s` itself
  if (ctx->allocator().record_stream(p, id) != kSuccess) return false;
  return ctx->allocator().free(p) == kSuccess;
}

// Runs `alloc` (a try_alloc*); on success returns true.  On out-of-memory
// the cache has already run its retry path, so the fallback to cudart
// (`fallback`) runs under RepeatOomGuard: cudart reproduces the error and
// its last-error state without a second retry path or OOM report.
template <typename Alloc, typename Fallback>
cudaError_t alloc_or_fallback(Alloc&& alloc, Fallback&& fallback) noexcept {
  Status s = kNotOwned;
  try {
    s = alloc();
  } catch (...) {
    s = kNotOwned;
  }
  if (s == kSuccess) return cudaSuccess;
  if (s == kOutOfMemory) {
    RepeatOomGuard guard;
    return fallback();
  }
  return fallback();
}

}  // namespace

EXPORT cudaError_t cudaMalloc(void** devPtr, size_t size) {
  CACHALLOC_ENTRY(cudaMalloc);
  REAL_CUDART(cudaMalloc);
  return alloc_or_fallback([&] { return try_alloc(devPtr, size, kUnorderedStreamId); },
                           [&] { return real_cudaMalloc ? real_cudaMalloc(devPtr, size) : cudaErrorInitializationError; });
}

EXPORT cudaError_t cudaFree(void* devPtr) {
  CACHALLOC_ENTRY(cudaFree);
  if (guarded(false, [&] { return try_free(devPtr); })) return cudaSuccess;
  REAL_CUDART(cudaFree);
  return real_cudaFree ? real_cudaFree(devPtr) : cudaErrorInitializationError;
}

EXPORT cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t stream) {
  CACHALLOC_ENTRY(cudaMallocAsync);
  REAL_CUDART(cudaMallocAsync);
  return alloc_or_fallback([&] { return try_alloc_async(devPtr, size, stream, false); }, [&] {
    return real_cudaMallocAsync ? real_cudaMallocAsync(devPtr, size, stream) : cudaErrorInitializationError;
  });
}

EXPORT cudaError_t cudaMallocAsync_ptsz(void** devPtr, size_t size, cudaStream_t stream) {
  CACHALLOC_ENTRY(cudaMallocAsync);
  REAL_CUDART(cudaMallocAsync_ptsz);
  return alloc_or_fallback([&] { return try_alloc_async(devPtr, size, stream, true); }, [&] {
    return real_cudaMallocAsync_ptsz ? real_cudaMallocAsync_ptsz(devPtr, size, stream) : cudaErrorInitializationError;
  });
}

EXPORT cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t stream) {
  CACHALLOC_ENTRY(cudaFreeAsync);
  if (guarded(false, [&] { return try_free_async(devPtr, stream, false); })) return cudaSuccess;
  REAL_CUDART(cudaFreeAsync);
  return real_cudaFreeAsync ? real_cudaFreeAsync(devPtr, stream) : cudaErrorInitializationError;
}

EXPORT cudaError_t cudaFreeAsync_ptsz(void* devPtr, cudaStream_t stream) {
  CACHALLOC_ENTRY(cudaFreeAsync);
  if (guarded(false, [&] { return try_free_async(devPtr, stream, true); })) return cudaSuccess;
  REAL_CUDART(cudaFreeAsync_ptsz);
  return real_cudaFreeAsync_ptsz ? real_cudaFreeAsync_ptsz(devPtr, stream) : cudaErrorInitializationError;
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
  Status s = kNotOwned;
  try {
    s = host_cache_alloc(pHost, size, flags);
  } catch (...) {
    s = kNotOwned;
  }
  if (s == kSuccess) return cudaSuccess;
  REAL_CUDART(cudaHostAlloc);
  return real_cudaHostAlloc ? real_cudaHostAlloc(pHost, size, flags) : cudaErrorInitializationError;
}

EXPORT cudaError_t cudaMallocHost(void** ptr, size_t size) {
  Status s = kNotOwned;
  try {
    s = host_cache_alloc(ptr, size, 0);
  } catch (...) {
    s = kNotOwned;
  }
  if (s == kSuccess) return cudaSuccess;
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
