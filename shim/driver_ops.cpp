// driver_ops.cpp — serve, pass through, or refuse.
#include "driver_ops.h"

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "capture_owned.h"
#include "capture_tracking.h"
#include "log.h"
#include "context_registry.h"
#include "free_policy.h"
#include "guarded.h"
#include "link_imports.h"
#include "primary_contexts.h"
#include "process_state.h"
#include "start_up.h"
#include "stream_ids.h"
#include "tags.h"

namespace cachalloc::shim {
namespace {

CUresult to_cu(Status s) { return static_cast<CUresult>(s); }

const RealDriver* driver() { return real_driver(); }

void count_foreign() { counters().count(obs::Passthrough::foreign_pointer); }
void count_capture() { counters().count(obs::Passthrough::capture); }

// Bumped by every stream destruction: a destroyed stream's handle may be
// reused by the next stream created, which must then be noted again.
std::atomic<std::uint64_t> g_stream_generation{0};

// Whether the program's stream `id` (valid: it is an argument of the call
// being served) is non-blocking.
bool is_nonblocking(StreamId id) {
  CUstream s = nullptr;
  if (is_per_thread_id(id) || !to_cu_stream(id, &s) || driver()->cuStreamGetFlags == nullptr) return false;
  unsigned int flags = 0;
  return driver()->cuStreamGetFlags(s, &flags) == CUDA_SUCCESS && (flags & CU_STREAM_NON_BLOCKING) != 0;
}

// Stream use noted once per (context, stream) per thread in the common case:
// the context's lock is taken only when the stream changes.  The test is
// inline, the noting out of line.
struct NotedUse {
  ContextState* ctx = nullptr;
  StreamId id = 0;
  std::uint64_t generation = 0;
};
constinit thread_local NotedUse t_noted;

[[gnu::noinline]] void note_use_now(ContextState* ctx, StreamId id, std::uint64_t generation) {
  // While a capture is in flight even a cuStreamGetFlags on the capturing
  // stream invalidates a thread-local capture (seen on the H200): note the
  // stream on a later call instead.  A per-thread stream needs no query
  // (it is blocking), so it is noted now (stream_order.h, note (3)).
  if (capture_in_flight() && !is_per_thread_id(id)) [[unlikely]] return;
  ctx->note_stream(id, is_nonblocking(id));
  t_noted = {ctx, id, generation};
}

[[gnu::always_inline]] inline void note_use(ContextState* ctx, StreamId id) {
  const std::uint64_t generation = g_stream_generation.load(std::memory_order_relaxed);
  const NotedUse& n = t_noted;
  if (id == kLegacyStreamId || (n.ctx == ctx && n.id == id && n.generation == generation)) [[likely]] return;
  note_use_now(ctx, id, generation);
}

// Frees `ptr` in whichever other context owns it (cross-context frees are
// legal with unified addressing), with that context made current.
template <typename FreeFn>
Status free_in_owner(ContextState* current, DevicePtr ptr, FreeFn&& free_fn) {
  ContextState* owner = find_owner(ptr);
  if (owner == nullptr || owner == current) return kNotOwned;
  ContextGuard guard(driver(), owner->context());
  return free_fn(*owner);
}

// Whether this call may use the calling thread's front cache
// (core/thread_cache.h): the one test that bypasses the layer.  Never
// during a graph capture (frees then wait for the capture's end, and
// allocations must not reuse memory the captured work will touch).
[[gnu::always_inline]] inline bool thread_cache_eligible() { return !capture_in_flight(); }

// An allocation for `id`: from the thread's front cache when the layer may
// be used and no tag is current (tagged memory lives in segments of its
// own, shim/tags.h), else from the allocator (out of line: the cache's
// hit then keeps its values in registers).
[[gnu::noinline]] CUresult serve_alloc_locked(ContextState& ctx, CUdeviceptr* out, size_t size, StreamId id) {
  DevicePtr p = 0;
  const Status s = tagged_malloc(ctx.allocator(), &p, size, id);
  if (s == kSuccess) *out = static_cast<CUdeviceptr>(p);
  return to_cu(s);
}

[[gnu::always_inline]] inline CUresult serve_alloc(ContextState& ctx, CUdeviceptr* out, size_t size, StreamId id) {
  DevicePtr p = 0;
  if (thread_cache_eligible() && current_tag_is_untagged() && ctx.allocator().front().malloc_cached(&p, size, id)) [[likely]] {
    *out = static_cast<CUdeviceptr>(p);
    return CUDA_SUCCESS;
  }
  return serve_alloc_locked(ctx, out, size, id);
}

// Stream-ordered free: a free on another stream than the block's waits for
// that stream (record_stream does nothing for the block's own stream).
// Through the thread's cache when that is allowed (free_cached records the
// stream itself when it is not the block's).
Status free_on_stream(ContextState& ctx, DevicePtr ptr, StreamId id) {
  if (thread_cache_eligible()) return ctx.allocator().front().free_cached(ptr, id);
  Status s = ctx.allocator().record_stream(ptr, id);
  if (s != kSuccess) return s;
  return ctx.allocator().free(ptr);
}

// A free immediately safe in stream order (rule stream) may go to the
// thread's cache, and so may a fenced one (it waits there for a fence the
// thread records over a batch of its frees: core/thread_cache.h, point
// (g)); the device rule takes the locked path.
// `give_tried`: free_in_last_cache just missed in this context's cache.
[[gnu::always_inline]] inline Status free_with_policy(ContextState& ctx, DevicePtr ptr, bool give_tried) {
  const FreeRule rule = choose_free_rule(ctx.free_sync(), ctx);
  if (thread_cache_eligible()) [[likely]] {
    if (rule == FreeRule::stream) [[likely]] return ctx.allocator().front().free_cached(ptr, kAnyStream, give_tried);
    if (rule == FreeRule::fence) return ctx.allocator().front().free_cached_fenced(ptr, give_tried);
  }
  return free_by_rule(ctx, ptr, rule);
}

// The same in `ctx` (or nullptr), else in the owner, made current.
[[gnu::always_inline]] inline Status free_on_stream_anywhere(ContextState* ctx, DevicePtr ptr, StreamId id) {
  const Status s = ctx != nullptr ? free_on_stream(*ctx, ptr, id) : kNotOwned;
  if (s != kNotOwned) return s;
  return free_in_owner(ctx, ptr, [&](ContextState& o) { return free_on_stream(o, ptr, id); });
}

CUresult pass_alloc_async(CUdeviceptr* out, size_t size, CUstream s, bool ptsz) {
  return ptsz ? driver()->cuMemAllocAsync_ptsz(out, size, s) : driver()->cuMemAllocAsync(out, size, s);
}

CUresult pass_free_async(CUdeviceptr ptr, CUstream s, bool ptsz) {
  return ptsz ? driver()->cuMemFreeAsync_ptsz(ptr, s) : driver()->cuMemFreeAsync(ptr, s);
}

thread_local bool t_repeat_oom = false;

std::atomic<bool> g_pools_configured{false};

// Whether `stream` belongs to another context than `ctx`.  The default
// streams are the current context's; another handle is asked about once per
// (thread, context, stream) until a stream is destroyed (its handle may be
// reused).  Not while a capture is in flight: a query there can invalidate a
// thread-local capture (seen with cuStreamGetFlags on the H200).
struct StreamOwner {
  const ContextState* ctx = nullptr;
  CUstream stream = nullptr;
  std::uint64_t generation = 0;
  bool other = false;
};
constinit thread_local StreamOwner t_stream_owner;

[[gnu::noinline]] bool stream_of_other_context_now(const ContextState& ctx, CUstream stream,
                                                   std::uint64_t generation) {
  if (capture_in_flight() || driver()->cuStreamGetCtx == nullptr) return false;
  CUcontext owner = nullptr;
  const bool other = driver()->cuStreamGetCtx(stream, &owner) == CUDA_SUCCESS && owner != ctx.context();
  t_stream_owner = {&ctx, stream, generation, other};
  return other;
}

}  // namespace

bool stream_of_other_context(const ContextState& ctx, CUstream stream) {
  if (stream == nullptr || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) return false;
  const std::uint64_t generation = g_stream_generation.load(std::memory_order_relaxed);
  const StreamOwner& o = t_stream_owner;
  if (o.ctx == &ctx && o.stream == stream && o.generation == generation) [[likely]] return o.other;
  return stream_of_other_context_now(ctx, stream, generation);
}

namespace {

// The context of created stream `stream` for a thread with no current
// context, or nullptr (a default stream names none then; an unknown handle
// is the driver's to refuse).  One (stream, context, its state) remembered
// per thread until a stream is destroyed or the context dies.
struct StreamContext {
  CUstream stream = nullptr;
  std::uint64_t generation = 0;
  CUcontext ctx = nullptr;
  ContextState* state = nullptr;  // set once a call was served there
};
constinit thread_local StreamContext t_stream_context;

CUcontext context_of_stream(CUstream stream) {
  if (stream == nullptr || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD ||
      driver()->cuStreamGetCtx == nullptr || capture_in_flight())
    return nullptr;
  const std::uint64_t generation = g_stream_generation.load(std::memory_order_relaxed);
  StreamContext& c = t_stream_context;
  if (c.stream == stream && c.generation == generation && c.ctx != nullptr &&
      (c.state == nullptr || c.state->alive())) [[likely]]
    return c.ctx;
  CUcontext owner = nullptr;
  if (driver()->cuStreamGetCtx(stream, &owner) != CUDA_SUCCESS) owner = nullptr;
  c = {stream, generation, owner, nullptr};
  return owner;
}

// The state whose front cache may serve a call on `stream` (id `id`) from a
// thread with no current context without any driver call: the stream's
// context served this thread on it before (so the stream's use is noted
// there), and nothing needs the locked paths (deferred frees to settle, a
// capture, a tag, pools the program configured).  Else nullptr.
[[gnu::always_inline]] inline ContextState* cached_stream_state(CUstream stream, StreamId id) {
  const std::uint64_t generation = g_stream_generation.load(std::memory_order_relaxed);
  const StreamContext& c = t_stream_context;
  ContextState* s = c.state;
  if (c.stream != stream || s == nullptr || c.generation != generation) return nullptr;
  const NotedUse& n = t_noted;
  if (n.ctx != s || n.id != id || n.generation != generation) return nullptr;
  if (!s->alive() || s->has_deferred() || !thread_cache_eligible() || !current_tag_is_untagged() ||
      g_pools_configured.load(std::memory_order_relaxed))
    return nullptr;
  return s;
}

}  // namespace

// A stream-ordered call from a thread with no current context.  cudart makes
// no context current for calls that carry a stream, so a thread that only
// calls cudaMallocAsync/cudaFreeAsync on a stream another thread created has
// none, and the driver serves it in the stream's context.  So does this: the
// stream's context is made current for the call (and the thread's own, none,
// restored), and the call is served as if the program had made it current.
// Before, these calls went to the driver's pool (tree 2755350, BENCHMARKS.md
// Archive: one thread on another thread's stream did 1.3 M pairs/s, against
// 10.4 on its own).  `served` is false, and nothing changed, when the stream names
// no context the shim could make current.
template <class Fn>
[[gnu::noinline]] CUresult in_stream_context(CUstream stream, bool* served, Fn&& fn) {
  *served = false;
  const CUcontext owner = context_of_stream(stream);
  if (owner == nullptr) return CUDA_SUCCESS;
  ContextGuard guard(driver(), owner);
  ContextState* state = current_context_state();
  if (state == nullptr) return CUDA_SUCCESS;
  if (state->context() == owner) t_stream_context.state = state;
  *served = true;
  return fn();
}

// The two calls without a current context (above): a hit of the thread's
// front cache for the stream's context first, which makes no driver call and
// so needs no context made current (cuCtxSetCurrent on every call kept 16
// threads on one stream at the rate of one); the rest in the stream's
// context.
[[gnu::noinline]] CUresult alloc_async_without_context(CUdeviceptr* out, size_t size, CUstream stream, bool ptsz) {
  const StreamId id = stream_id(stream, ptsz);
  if (ContextState* s = cached_stream_state(stream, id); s != nullptr) {
    DevicePtr p = 0;
    if (s->allocator().front().malloc_cached<false>(&p, size, id)) {
      *out = static_cast<CUdeviceptr>(p);
      return CUDA_SUCCESS;
    }
  }
  bool served = false;
  const CUresult r = in_stream_context(stream, &served, [&] { return do_mem_alloc_async(out, size, stream, ptsz); });
  return served ? r : pass_alloc_async(out, size, stream, ptsz);
}

// *served false: the stream names no context; the caller goes on as before.
[[gnu::noinline]] CUresult free_async_without_context(CUdeviceptr ptr, CUstream stream, bool ptsz, bool* served) {
  const StreamId id = stream_id(stream, ptsz);
  if (ContextState* s = cached_stream_state(stream, id); s != nullptr) {
    if (s->allocator().front().give_cached(static_cast<DevicePtr>(ptr), id)) {
      *served = true;
      return CUDA_SUCCESS;
    }
  }
  return in_stream_context(stream, served, [&] { return do_mem_free_async(ptr, stream, ptsz); });
}

bool serve_async_on(const ContextState& ctx, CUstream stream, bool ptsz) {
  if (g_pools_configured.load(std::memory_order_relaxed)) [[unlikely]] return false;
  (void)ptsz;  // a _ptsz handle 0 is the per-thread stream: the current context's
  return !stream_of_other_context(ctx, stream);
}

void note_pools_configured(const char* call) {
  if (g_pools_configured.exchange(true, std::memory_order_relaxed)) return;
  obs::logger().info("{}: the program configures CUDA memory pools; cuMemAllocAsync/cudaMallocAsync go to the "
                     "driver from now on (blocks served before keep cachalloc's properties)",
                     call);
}

RepeatOomGuard::RepeatOomGuard() { t_repeat_oom = true; }
RepeatOomGuard::~RepeatOomGuard() { t_repeat_oom = false; }

namespace {

// A due fence of the owner's thread cache, recorded with the owner current.
[[gnu::noinline, gnu::cold]] void fence_cached_frees_in(ContextState& owner) {
  ContextGuard guard(driver(), owner.context());
  owner.allocator().front().fence_cached_frees();
}

// The free of a block that the calling thread's cache handed out, served
// without asking the driver which context is current: the thread's cache
// for its last-used context (t_last) gives it back when that cache handed
// `ptr` out, and then that context owns `ptr`, so the full path would have
// reached the same give (for the current context, or through free_in_owner
// with the owner made current; a hit makes no driver call, and a due fence
// is recorded here with the owner made current).  Not with capture-deferred
// frees to settle, the device rule or a capture in flight: false, nothing
// changed, and the caller takes the full path; *tried then names the
// context whose cache missed (its free need not look there again), or is
// nullptr.
[[gnu::always_inline]] inline bool free_in_last_cache(DevicePtr ptr, ContextState** tried) {
  ContextState* last = detail::t_last.state;
  if (last == nullptr || !last->alive() || last->has_deferred() || !thread_cache_eligible()) [[unlikely]]
    return false;
  const FreeRule rule = choose_free_rule(last->free_sync(), *last);
  bool kept = false;
  if (rule == FreeRule::stream) [[likely]] {
    kept = last->allocator().front().give_cached(ptr);
  } else if (rule == FreeRule::fence) {
    const ThreadCache::GiveFenced r = last->allocator().front().give_cached_fenced(ptr);
    if (r == ThreadCache::kFenceDue) [[unlikely]] fence_cached_frees_in(*last);
    kept = r != ThreadCache::kNotMine;
  } else {
    return false;
  }
  if (!kept) *tried = last;
  return kept;
}

// A plain free by the free_sync rule: in `ctx` (the current context's
// state, or nullptr), else in whichever other context owns `ptr`, made
// current for the call.  kNotOwned: no context's cache owns it.  `tried`:
// whose thread cache free_in_last_cache already asked.
[[gnu::always_inline]] inline Status free_anywhere(ContextState* ctx, DevicePtr ptr, ContextState* tried) {
  const Status s = ctx != nullptr ? free_with_policy(*ctx, ptr, ctx == tried) : kNotOwned;
  if (s != kNotOwned) [[likely]] return s;
  return free_in_owner(ctx, ptr, [&](ContextState& o) { return free_with_policy(o, ptr, &o == tried); });
}

}  // namespace

// During a capture (capture_owned.h): out of line, off the cached pair's path.
[[gnu::noinline, gnu::cold]] CUresult alloc_in_capture(ContextState& ctx, CUdeviceptr* out, size_t size, StreamId id,
                                                      bool bare) {
  DevicePtr p = 0;
  const CUresult r = alloc_during_capture(ctx, &p, size, id, bare);
  if (r == CUDA_SUCCESS) *out = static_cast<CUdeviceptr>(p);
  return r;
}

// A free during a capture; a pointer no context owns goes to the driver,
// which answers for its own memory (and refuses it during a strict capture
// by itself).
[[gnu::noinline, gnu::cold]] CUresult free_in_capture(CUdeviceptr ptr, bool bare) {
  const Status s = free_during_capture(static_cast<DevicePtr>(ptr), bare);
  if (s != kNotOwned) return to_cu(s);
  count_foreign();
  return driver()->cuMemFree_v2(ptr);
}

// serve_mem_alloc and serve_mem_free (the mode known to be active) run
// inline in the exported cuMemAlloc_v2 and cuMemFree_v2 (end of this file):
// one call frame less on every cached pair.
[[gnu::always_inline]] inline CUresult serve_mem_alloc(CUdeviceptr* out, size_t size) {
  if (out == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  if (t_repeat_oom) [[unlikely]] return CUDA_ERROR_OUT_OF_MEMORY;
  ContextState* ctx = current_context_state();
  if (ctx == nullptr) return driver()->cuMemAlloc_v2(out, size);
  settle_deferred_frees(*ctx);
  if (capture_in_flight()) [[unlikely]] return alloc_in_capture(*ctx, out, size, kUnorderedStreamId, true);
  return serve_alloc(*ctx, out, size, kUnorderedStreamId);
}

[[gnu::always_inline]] inline CUresult serve_mem_free(CUdeviceptr ptr) {
  if (ptr == 0) return CUDA_SUCCESS;
  ContextState* tried = nullptr;
  if (free_in_last_cache(static_cast<DevicePtr>(ptr), &tried)) [[likely]] return CUDA_SUCCESS;
  // (free_in_last_cache takes nothing during a capture.)
  if (capture_in_flight()) [[unlikely]] return free_in_capture(ptr, true);
  ContextState* ctx = current_context_state();
  if (ctx != nullptr) settle_deferred_frees(*ctx);
  const Status s = free_anywhere(ctx, static_cast<DevicePtr>(ptr), tried);
  if (s != kNotOwned) return to_cu(s);
  count_foreign();
  return driver()->cuMemFree_v2(ptr);
}

// The long way, for a call outside the fast lane (process_state.h): first
// calls, other modes, wrapper timing on.
[[gnu::noinline]] CUresult mem_alloc_slow(CUdeviceptr* out, size_t size) {
  WrapperTimer timer;
  const Mode m = current_mode();
  if (!serving(m)) [[unlikely]] {
    if (m == Mode::exiting || driver() == nullptr) return CUDA_ERROR_DEINITIALIZED;
    return driver()->cuMemAlloc_v2(out, size);
  }
  return serve_mem_alloc(out, size);
}

[[gnu::noinline]] CUresult mem_free_slow(CUdeviceptr ptr) {
  WrapperTimer timer;
  if (ptr == 0) return CUDA_SUCCESS;
  const Mode m = current_mode();
  if (!serving(m)) [[unlikely]] {
    if (m == Mode::exiting || driver() == nullptr) return CUDA_SUCCESS;
    return driver()->cuMemFree_v2(ptr);
  }
  return serve_mem_free(ptr);
}

CUresult do_mem_alloc_async(CUdeviceptr* out, size_t size, CUstream stream, bool ptsz) {
  const Mode m = current_mode();
  if (!serving(m)) [[unlikely]] {
    if (m == Mode::exiting || driver() == nullptr) return CUDA_ERROR_DEINITIALIZED;
    return pass_alloc_async(out, size, stream, ptsz);
  }
  if (out == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  if (stream_is_capturing(stream, ptsz)) [[unlikely]] {
    count_capture();
    return pass_alloc_async(out, size, stream, ptsz);
  }
  if (t_repeat_oom) [[unlikely]] return CUDA_ERROR_OUT_OF_MEMORY;
  ContextState* ctx = current_context_state();
  if (ctx == nullptr) [[unlikely]] return alloc_async_without_context(out, size, stream, ptsz);
  if (!serve_async_on(*ctx, stream, ptsz)) [[unlikely]] return pass_alloc_async(out, size, stream, ptsz);
  const StreamId id = stream_id(stream, ptsz);
  note_use(ctx, id);
  settle_deferred_frees(*ctx);
  // Another stream than the capturing one: served, and owned by the capture.
  if (capture_in_flight()) [[unlikely]] return alloc_in_capture(*ctx, out, size, id, false);
  return serve_alloc(*ctx, out, size, id);
}

CUresult do_mem_free_async(CUdeviceptr ptr, CUstream stream, bool ptsz) {
  if (ptr == 0) return CUDA_SUCCESS;
  const Mode m = current_mode();
  if (!serving(m)) [[unlikely]] {
    if (m == Mode::exiting || driver() == nullptr) return CUDA_SUCCESS;
    return pass_free_async(ptr, stream, ptsz);
  }
  // During a capture the driver frees only graph allocations; freeing a
  // cachalloc block now would let the next allocation reuse memory that the
  // captured kernels will use when the graph runs.
  if (stream_is_capturing(stream, ptsz)) [[unlikely]] {
    if (find_owner(static_cast<DevicePtr>(ptr)) != nullptr) return CUDA_ERROR_INVALID_VALUE;
    count_capture();
    return pass_free_async(ptr, stream, ptsz);
  }
  ContextState* ctx = current_context_state();
  if (ctx == nullptr) [[unlikely]] {
    bool served = false;
    const CUresult r = free_async_without_context(ptr, stream, ptsz, &served);
    if (served) return r;
  }
  const StreamId id = stream_id(stream, ptsz);
  // (A stream of another context is noted there, when it is created.)
  if (ctx != nullptr && !stream_of_other_context(*ctx, stream)) note_use(ctx, id);
  // A stream that is not capturing, during a capture: held for it (the
  // captured work may use the block; the release waits for all the
  // context's work, this stream's included).
  if (capture_in_flight()) [[unlikely]] {
    const Status held = free_during_capture(static_cast<DevicePtr>(ptr), false);
    if (held != kNotOwned) return to_cu(held);
    count_foreign();
    return pass_free_async(ptr, stream, ptsz);
  }
  const Status s = free_on_stream_anywhere(ctx, ptr, id);
  if (s != kNotOwned) return to_cu(s);
  count_foreign();  // not ours: from the driver's pool or elsewhere
  return pass_free_async(ptr, stream, ptsz);
}

// ---- the runtime route (driver_ops.h) ----
// The driver route's sequences above, but every call the cache does not
// complete answers `pass` (cudart's function runs) where the driver route
// would call the driver: so do no current context, a capture in flight,
// and any error (cudart reproduces it through the hooked call).

namespace {

RuntimeAnswer runtime_answer(CUresult r) {
  if (r == CUDA_SUCCESS) [[likely]] return RuntimeAnswer::served;
  return r == CUDA_ERROR_OUT_OF_MEMORY ? RuntimeAnswer::pass_out_of_memory : RuntimeAnswer::pass;
}

// The current context's state when the runtime route may serve, else
// nullptr (cudart's path).
ContextState* runtime_context() {
  if (!serving(current_mode()) || capture_in_flight()) return nullptr;
  return current_context_state();
}

}  // namespace

RuntimeAnswer runtime_malloc(void** out, size_t size) {
  if (out == nullptr || size == 0) return RuntimeAnswer::pass;
  ContextState* ctx = runtime_context();
  if (ctx == nullptr) return RuntimeAnswer::pass;
  settle_deferred_frees(*ctx);
  CUdeviceptr p = 0;
  const CUresult r = serve_alloc(*ctx, &p, size, kUnorderedStreamId);
  if (r == CUDA_SUCCESS) *out = reinterpret_cast<void*>(p);
  return runtime_answer(r);
}

// cudaFree(NULL) goes to cudart: programs call it to initialize the runtime.
// Another context's block is freed in that context (free_anywhere).
RuntimeAnswer runtime_free(void* ptr) {
  ContextState* ctx = ptr != nullptr ? runtime_context() : nullptr;
  if (ctx == nullptr) return RuntimeAnswer::pass;
  const auto p = reinterpret_cast<DevicePtr>(ptr);
  ContextState* tried = nullptr;
  if (free_in_last_cache(p, &tried)) [[likely]] return RuntimeAnswer::served;
  settle_deferred_frees(*ctx);
  return free_anywhere(ctx, p, tried) == kSuccess ? RuntimeAnswer::served : RuntimeAnswer::pass;
}

// A stream being captured, or of another context, goes to cudart (and on
// to the hooked cuMemAllocAsync), as does a capture on another stream.
RuntimeAnswer runtime_malloc_async(void** out, size_t size, CUstream stream, bool ptsz) {
  if (out == nullptr || size == 0 || !serving(current_mode()) || stream_is_capturing(stream, ptsz) ||
      capture_in_flight())
    return RuntimeAnswer::pass;
  ContextState* ctx = current_context_state();
  if (ctx == nullptr || !serve_async_on(*ctx, stream, ptsz)) return RuntimeAnswer::pass;
  const StreamId id = stream_id(stream, ptsz);
  note_use(ctx, id);
  settle_deferred_frees(*ctx);
  CUdeviceptr p = 0;
  const CUresult r = serve_alloc(*ctx, &p, size, id);
  if (r == CUDA_SUCCESS) *out = reinterpret_cast<void*>(p);
  return runtime_answer(r);
}

RuntimeAnswer runtime_free_async(void* ptr, CUstream stream, bool ptsz) {
  ContextState* ctx = ptr != nullptr ? runtime_context() : nullptr;
  if (ctx == nullptr) return RuntimeAnswer::pass;
  const StreamId id = stream_id(stream, ptsz);
  if (!stream_of_other_context(*ctx, stream)) note_use(ctx, id);
  return free_on_stream_anywhere(ctx, reinterpret_cast<DevicePtr>(ptr), id) == kSuccess ? RuntimeAnswer::served
                                                                                        : RuntimeAnswer::pass;
}

// ---- the pluggable route (driver_ops.h) ----

namespace {

// The reserved bytes of `s` are within the run-time fraction of `device`.
bool within_fraction(ContextState& s, int device) {
  const double f = memory_fraction_override(device);
  if (f <= 0.0 || f >= 1.0) [[likely]] return true;
  const double cap = f * static_cast<double>(s.device_total());
  return static_cast<double>(s.allocator().stats().reserved_bytes[StatType::aggregate].current) <= cap;
}

Status free_recorded(ContextState& s, DevicePtr p, StreamId id) {
  const Status st = s.allocator().record_stream(p, id);
  return st != kSuccess ? st : s.allocator().free(p);
}

}  // namespace

void* pluggable_malloc(std::size_t size, int device, CUstream stream) {
  ContextState* s = current_context_state();
  if (s == nullptr) return nullptr;
  const StreamId id = stream_id(stream, false);
  CachingAllocator& a = s->allocator();
  for (int attempt = 0; attempt < 2; ++attempt) {
    DevicePtr p = 0;
    if (tagged_malloc(a, &p, size, id) != kSuccess) return nullptr;  // the core wrote the OOM report
    if (within_fraction(*s, device)) return reinterpret_cast<void*>(p);
    a.free(p);
    a.empty_cache();  // then retry; after the retry, what the failed attempt cached goes back too
  }
  obs::logger().error("cachalloc_malloc: {} bytes on device {} would exceed the memory fraction {} of {} bytes",
                      size, device, memory_fraction_override(device), s->device_total());
  return nullptr;
}

// The free names the wrong device when the owner is another device's
// cache: passive, that device's primary context is checked too (a reset
// the hooks could not see) before its cache is touched.
Status pluggable_free(void* ptr, CUstream stream, Mode m) {
  const auto p = reinterpret_cast<DevicePtr>(ptr);
  const StreamId id = stream_id(stream, false);
  ContextState* s = current_context_state();
  Status st = s != nullptr ? free_recorded(*s, p, id) : kNotOwned;
  if (st != kNotOwned) return st;
  ContextState* owner = find_owner(p);
  if (owner != nullptr && owner != s && m == Mode::passive) {
    (void)live_primary(driver(), owner->device(), m, false);
    if (drop_orphan(ptr)) return kSuccess;
    owner = find_owner(p);
  }
  if (owner != nullptr && owner != s) {
    ContextGuard guard(driver(), owner->context());
    st = free_recorded(*owner, p, id);
  }
  if (st != kNotOwned) return st;
  count_foreign();
  return static_cast<Status>(driver()->cuMemFree_v2(static_cast<CUdeviceptr>(p)));
}

// Free memory as an allocation could obtain it: the driver's free plus what
// the cache could release, capped by the per-process fraction.
CUresult do_mem_get_info(size_t* free_bytes, size_t* total_bytes) {
  const Mode m = current_mode();
  if (!serving(m)) [[unlikely]] {
    if (m == Mode::exiting || driver() == nullptr) return CUDA_ERROR_DEINITIALIZED;
    return driver()->cuMemGetInfo_v2(free_bytes, total_bytes);
  }
  size_t f = 0, t = 0;
  CUresult r = driver()->cuMemGetInfo_v2(&f, &t);
  if (r != CUDA_SUCCESS) return r;
  if (ContextState* ctx = current_context_state()) {
    CachingAllocator& a = ctx->allocator();
    a.reclaim();  // completed fences merge their blocks first
    const size_t releasable = a.releasable_bytes();
    f = std::min(f + releasable, t);
    if (config().per_process_memory_fraction < 1.0) {
      const auto reserved = static_cast<size_t>(a.stats().reserved_bytes[StatType::aggregate].current);
      const size_t allowed = a.allowed_bytes();
      const size_t cap = (allowed > reserved ? allowed - reserved : 0) + releasable;
      f = std::min(f, cap);
    }
  }
  if (free_bytes != nullptr) *free_bytes = f;
  if (total_bytes != nullptr) *total_bytes = t;
  return CUDA_SUCCESS;
}

void note_stream_created(CUstream stream, unsigned int flags) {
  if (obs::logger().should_log(LogLevel::debug))
    obs::logger().debug("stream {} created", static_cast<const void*>(stream));
  if (!serving(current_mode())) return;
  check_link_imports();  // objects loaded since start-up (link_imports.h)
  if (ContextState* ctx = current_context_state())
    ctx->note_stream(stream_id(stream, false), (flags & CU_STREAM_NON_BLOCKING) != 0);
}

// The stream's own context forgets it, whichever context is current (multi-
// GPU programs destroy streams without switching device): asked of the
// driver while the handle is still valid.  Retiring its blocks records an
// event on it, so that context is made current meanwhile.
void note_stream_destroying(CUstream stream) {
  if (obs::logger().should_log(LogLevel::debug))
    obs::logger().debug("stream {} destroyed", static_cast<const void*>(stream));
  g_stream_generation.fetch_add(1, std::memory_order_relaxed);
  if (!serving(current_mode())) return;
  if (stream == nullptr || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) return;
  CUcontext owner_ctx = nullptr;
  ContextState* owner = nullptr;
  if (driver()->cuStreamGetCtx != nullptr && driver()->cuStreamGetCtx(stream, &owner_ctx) == CUDA_SUCCESS)
    owner = live_state_of(owner_ctx);
  else
    owner = current_context_state();  // an old driver: the current context, as before
  if (owner == nullptr) return;
  ContextGuard guard(driver(), owner->context());
  owner->retire_stream(stream_id(stream, false));
}

}  // namespace cachalloc::shim

// The exported driver entry points of the cached pair (the others are in
// entry_points.cpp, which says what every wrapper does): counted, timed, no
// exception crossing into C.  In the fast lane (active, timing off: one
// load) they serve inline; everything else goes the long way, timed.
#define EXPORT extern "C" __attribute__((visibility("default")))

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  cachalloc::shim::count_call(cachalloc::obs::Entry::cuMemAlloc_v2);
  return cachalloc::shim::guarded([&] {
    if (cachalloc::shim::fast_lane()) [[likely]]
      return cachalloc::shim::serve_mem_alloc(dptr, bytesize);
    return cachalloc::shim::mem_alloc_slow(dptr, bytesize);
  });
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  cachalloc::shim::count_call(cachalloc::obs::Entry::cuMemFree_v2);
  return cachalloc::shim::guarded([&] {
    if (cachalloc::shim::fast_lane()) [[likely]]
      return cachalloc::shim::serve_mem_free(dptr);
    return cachalloc::shim::mem_free_slow(dptr);
  });
}
