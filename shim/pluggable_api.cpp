// pluggable_api.cpp — PyTorch's pluggable allocator ABI (include/cachalloc.h).
//
//   torch.cuda.memory.CUDAPluggableAllocator(path, "cachalloc_malloc", "cachalloc_free")
//
// loads libcachalloc.so with ctypes (dlopen, RTLD_LOCAL) and calls
//   void* cachalloc_malloc(ssize_t size, int device, cudaStream_t stream)
//   void  cachalloc_free(void* ptr, ssize_t size, int device, cudaStream_t stream)
// for every tensor (or, under torch.cuda.MemPool, for every segment of the
// pool).  Both run on the device's primary context (made current for the
// call when another context is current, then restored), in the same
// per-context allocator the hooks use when the library is also preloaded.
// The primary contexts, their reset check and the run-time memory fraction
// live below this file and the control API, in primary_contexts.cpp; the
// entry points that only call the control API (empty_cache, the fraction,
// base_alloc, record_stream) call it through include/cachalloc.h.
//
// Stream order is PyTorch's: a block is allocated for `stream` and, once
// freed, reused at once by the next allocation on that stream; another
// stream gets it only after events recorded on every stream the block was
// recorded on (cachalloc_pluggable_record_stream, torch's
// Tensor.record_stream) have completed.  The free's own `stream` argument is
// the allocation's stream (torch stores it); a different one is recorded
// like record_stream, so it is honoured either way.
//
// Loaded this way the library does not intercept anything else in the
// process (load_mode.h: Mode::passive).  When another copy of the library is
// preloaded from another path, every entry point here forwards to that copy,
// so one allocator state serves the process; loaded from the same path,
// dlopen returns the preloaded object itself.
//
// Graph capture: while `stream` is being captured the caches are not used
// (a cached block's pending events cannot be queried, nor new ones recorded,
// without invalidating the capture).  With PyTorch's graph-pool hooks wired
// (graph_pools.h; cachalloc.use_with_torch() does it) an allocation goes to
// the capture's pool, whose blocks live until PyTorch releases the pool.
// Without them (an older PyTorch, another framework) it goes to cuMemAlloc_v2
// and is never freed nor reused (a replay of the graph may write it whenever
// it runs; the first such allocation says so on stderr).  Either way
// cuMemAlloc runs with the thread's capture mode relaxed, as in PyTorch's
// own allocator, and frees of cached blocks wait until no capture is in
// flight.
#include <sys/types.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "cachalloc.h"
#include "capture_tracking.h"
#include "context_registry.h"
#include "driver_ops.h"
#include "graph_pools.h"
#include "guarded.h"
#include "load_mode.h"
#include "log.h"
#include "primary_contexts.h"
#include "process_state.h"
#include "start_up.h"
#include "real_driver.h"

#define CACHALLOC_EXPORT extern "C" __attribute__((visibility("default")))

namespace cachalloc::shim {
namespace {

// --- forwarding to a preloaded copy ------------------------------------------

using MallocFn = void* (*)(ssize_t, int, CUstream);
using FreeFn = void (*)(void*, ssize_t, int, CUstream);
using InitFn = void (*)(int);
using EmptyFn = void (*)();
using FractionFn = void (*)(double, int);
using BaseFn = void* (*)(void*, size_t*);
using RecordFn = void (*)(void*, CUstream);

struct Forward {
  MallocFn malloc = nullptr;
  FreeFn free = nullptr;
  InitFn init = nullptr;
  EmptyFn empty_cache = nullptr;
  FractionFn fraction = nullptr;
  BaseFn base_alloc = nullptr;
  RecordFn record_stream = nullptr;
};

template <typename Fn>
Fn other(const char* name) {
  return reinterpret_cast<Fn>(other_copy_symbol(name));
}

// Resolved once, before this copy initializes anything of its own.
const Forward& forward() {
  static const Forward f = [] {
    Forward r;
    r.malloc = other<MallocFn>("cachalloc_malloc");
    if (r.malloc == nullptr) return r;  // no other copy: serve here
    r.free = other<FreeFn>("cachalloc_free");
    r.init = other<InitFn>("cachalloc_pluggable_init");
    r.empty_cache = other<EmptyFn>("cachalloc_pluggable_empty_cache");
    r.fraction = other<FractionFn>("cachalloc_pluggable_set_memory_fraction");
    r.base_alloc = other<BaseFn>("cachalloc_pluggable_base_alloc");
    r.record_stream = other<RecordFn>("cachalloc_pluggable_record_stream");
    if (r.free == nullptr) r = Forward{};  // not a copy of this library after all
    return r;
  }();
  return f;
}

// --- graph capture -----------------------------------------------------------------

// Whether `stream` is being captured.  Preloaded, the hooks count captures
// and the driver is asked only while one is in flight; dlopen'ed, nothing
// counts them, so the driver is asked (an error counts as capturing).
bool capturing(const RealDriver* d, Mode m, CUstream stream) {
  if (m == Mode::active) return stream_is_capturing(stream, false);
  if (d->cuStreamIsCapturing == nullptr) return false;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  return d->cuStreamIsCapturing(stream, &status) != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE;
}

struct DeferredFree {
  void* ptr;
  int device;
  CUstream stream;
};
std::mutex g_deferred_mutex;
std::atomic<std::size_t> g_deferred_count{0};

// Leaked on purpose (frees may come during exit); created at first use, so
// loading the library runs no constructor.
std::vector<DeferredFree>& deferred_frees() {
  static auto* v = new std::vector<DeferredFree>();
  return *v;
}

// Allocations made during a capture (see the banner), kept for good.
std::mutex g_graph_mutex;
std::atomic<std::size_t> g_graph_count{0};
std::unordered_map<void*, std::size_t>& graph_allocations() {
  static auto* m = new std::unordered_map<void*, std::size_t>();  // leaked, as deferred_frees()
  return *m;
}

void keep_for_graphs(void* ptr, std::size_t size) {
  std::size_t count = 0;
  {
    std::lock_guard lock(g_graph_mutex);
    auto& m = graph_allocations();
    m.emplace(ptr, size);
    count = m.size();
    g_graph_count.store(count, std::memory_order_relaxed);
  }
  if (count == 1)
    obs::logger().warn("cachalloc_malloc during a CUDA graph capture: served by cuMemAlloc and never freed nor "
                       "reused, because a replay of the graph may write it and the pluggable interface does not "
                       "say when the graph is destroyed (the first: {} bytes).  Use PyTorch's own allocator for "
                       "CUDA graphs captured often.",
                       size);
}

// Whether `ptr` was allocated during a capture (then its free does nothing).
bool kept_for_graphs(void* ptr) {
  if (g_graph_count.load(std::memory_order_relaxed) == 0) [[likely]] return false;
  std::lock_guard lock(g_graph_mutex);
  return graph_allocations().count(ptr) != 0;
}

void defer_free(void* ptr, int device, CUstream stream) {
  std::lock_guard lock(g_deferred_mutex);
  deferred_frees().push_back({ptr, device, stream});
  g_deferred_count.store(deferred_frees().size(), std::memory_order_relaxed);
}

// --- serving: the decisions are driver_ops.h's ---------------------------------

// Frees `p` (the primary context of its device current, or the caller's).
// Memory allocated during a capture is kept (see the banner); a block of a
// context found reset is dropped.
void free_now(Mode m, void* ptr, CUstream stream) {
  if (kept_for_graphs(ptr)) [[unlikely]] return;
  if (drop_orphan(ptr)) [[unlikely]] return;
  const Status st = pluggable_free(ptr, stream, m);
  if (st != kSuccess)
    obs::logger().error("cachalloc_free({}): not a live allocation (freed twice, or not from cachalloc_malloc): "
                        "error {}",
                        ptr, static_cast<int>(st));
}

// Frees what waited for captures to end, once none is in flight (the
// caller's stream is not capturing and, preloaded, the hooks count none).
void settle_deferred(const RealDriver* d, Mode m) {
  if (g_deferred_count.load(std::memory_order_relaxed) == 0) [[likely]] return;
  if (m == Mode::active && capture_in_flight()) return;
  std::vector<DeferredFree> todo;
  {
    std::lock_guard lock(g_deferred_mutex);
    todo.swap(deferred_frees());
    g_deferred_count.store(0, std::memory_order_relaxed);
  }
  for (const DeferredFree& f : todo) {
    std::optional<ContextGuard> guard;
    if (CUcontext ctx = live_primary(d, f.device, m, false)) guard.emplace(d, ctx);
    free_now(m, f.ptr, f.stream);
  }
}

}  // namespace

}  // namespace cachalloc::shim

using namespace cachalloc;
using namespace cachalloc::shim;

CACHALLOC_EXPORT void* cachalloc_malloc(ssize_t size, int device, struct CUstream_st* stream) {
  if (const Forward& f = forward(); f.malloc != nullptr) return f.malloc(size, device, stream);
  return guarded(static_cast<void*>(nullptr), [&]() -> void* {
    if (size <= 0) return nullptr;
    const Mode m = current_mode();
    const RealDriver* d = real_driver();
    if (m == Mode::exiting || d == nullptr) return nullptr;
    CUcontext ctx = live_primary(d, device, m, true);  // passive: checked against a reset
    if (ctx == nullptr) return nullptr;
    ContextGuard guard(d, ctx);
    CUdeviceptr p = 0;
    if (!caching(m)) {  // disabled (bad CACHALLOC_CONF), forked: the driver's memory
      return d->cuMemAlloc_v2(&p, static_cast<size_t>(size)) == CUDA_SUCCESS ? reinterpret_cast<void*>(p) : nullptr;
    }
    if (capturing(d, m, stream)) [[unlikely]] {
      counters().count(obs::Passthrough::capture);
      if (void* out = nullptr; graph_pool_malloc(d, device, stream, static_cast<std::size_t>(size), &out)) return out;
      if (alloc_during_capture(d, &p, static_cast<size_t>(size)) != CUDA_SUCCESS) return nullptr;
      keep_for_graphs(reinterpret_cast<void*>(p), static_cast<std::size_t>(size));
      return reinterpret_cast<void*>(p);
    }
    settle_deferred(d, m);
    give_back_released_pool_blocks(d);
    return pluggable_malloc(static_cast<std::size_t>(size), device, stream);
  });
}

CACHALLOC_EXPORT void cachalloc_free(void* ptr, ssize_t size, int device, struct CUstream_st* stream) {
  if (ptr == nullptr) return;
  if (const Forward& f = forward(); f.free != nullptr) return f.free(ptr, size, device, stream);
  guarded(0, [&] {
    const Mode m = current_mode();
    const RealDriver* d = real_driver();
    if (m == Mode::exiting || d == nullptr) return 0;  // the process is ending: nothing is reused any more
    // None for a bad device (the owner is looked up below), nor for a
    // primary context found destroyed and not retained again since.
    std::optional<ContextGuard> guard;
    if (CUcontext ctx = live_primary(d, device, m, false)) guard.emplace(d, ctx);
    if (!caching(m)) {
      d->cuMemFree_v2(reinterpret_cast<CUdeviceptr>(ptr));
      return 0;
    }
    if (drop_orphan(ptr)) [[unlikely]] return 0;  // before its stream is asked anything: it may be dead too
    if (graph_pool_free(ptr, stream)) [[unlikely]] return 0;
    if (capturing(d, m, stream)) [[unlikely]] {
      defer_free(ptr, device, stream);
      return 0;
    }
    settle_deferred(d, m);
    give_back_released_pool_blocks(d);
    free_now(m, ptr, stream);
    return 0;
  });
}

CACHALLOC_EXPORT void cachalloc_pluggable_init(int device_count) {
  (void)device_count;
  if (const Forward& f = forward(); f.init != nullptr) return f.init(device_count);
  guarded(0, [] {
    (void)current_mode();  // reads CACHALLOC_CONF and loads the driver now rather than at the first allocation
    return 0;
  });
}

CACHALLOC_EXPORT void cachalloc_pluggable_empty_cache(void) {
  if (const Forward& f = forward(); f.empty_cache != nullptr) return f.empty_cache();
  (void)cachalloc_empty_cache(-1);
}

CACHALLOC_EXPORT void cachalloc_pluggable_set_memory_fraction(double fraction, int device) {
  if (const Forward& f = forward(); f.fraction != nullptr) return f.fraction(fraction, device);
  (void)cachalloc_set_memory_fraction(fraction, device);
}

CACHALLOC_EXPORT void* cachalloc_pluggable_base_alloc(void* ptr, size_t* size) {
  if (const Forward& f = forward(); f.base_alloc != nullptr) return f.base_alloc(ptr, size);
  void* base = ptr;
  if (cachalloc_get_base_allocation(ptr, &base, size) != CACHALLOC_SUCCESS) return ptr;
  return base;
}

CACHALLOC_EXPORT void cachalloc_pluggable_record_stream(void* ptr, struct CUstream_st* stream) {
  if (const Forward& f = forward(); f.record_stream != nullptr) return f.record_stream(ptr, stream);
  const int rc = cachalloc_record_stream(ptr, stream);
  if (rc == CACHALLOC_SUCCESS || rc == CACHALLOC_ERROR_NOT_INITIALIZED || rc == CACHALLOC_ERROR_DEINITIALIZED) return;
  guarded(0, [&] {
    obs::logger().warn("record_stream({}, stream {}): not a live cachalloc block (error {}); ignored", ptr,
                       static_cast<const void*>(stream), rc);
    return 0;
  });
}
