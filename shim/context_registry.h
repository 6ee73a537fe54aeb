// context_registry.h — one CachingAllocator per live CUcontext.
//
// Memory of one context is not usable in another, so each context gets its
// own allocator and backend, created the first time an allocation is made
// with it current.  Per context the registry also keeps what the free
// policy needs: the order of the context's streams (stream_order.h) and
// frees deferred by a graph capture.
//
// Context lifetime: when the driver destroys a context (cuCtxDestroy, a
// primary context reset or its last release), forget_context() retires its
// state: the backend is detached (no later call reaches the driver for that
// context's segments, events or streams, which died with it), the state
// leaves every lookup, and its statistics stay for the exit report.  A new
// context with the same handle value then starts from a fresh cache.
// States are never deleted: allocators live until the process ends, so no
// driver call happens from a static destructor.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "caching_allocator.h"
#include "cuda_backend.h"
#include "real_driver.h"
#include "stream_ids.h"
#include "stream_order.h"

namespace cachalloc::shim {

class ContextState {
 public:
  ContextState(CUcontext ctx, CUdevice device, std::size_t device_total, unsigned index, const RealDriver* driver,
               const Config& config);

  CUcontext context() const { return ctx_; }
  int device() const { return device_; }
  std::size_t device_total() const { return device_total_; }  // bytes, from cuMemGetInfo at creation
  CachingAllocator& allocator() { return *allocator_; }
  // config().free_sync, kept here: every cuMemFree asks.
  FreeSync free_sync() const { return free_sync_; }
  // A process-unique id for allocation `serial` of this context's allocator,
  // as CU_POINTER_ATTRIBUTE_BUFFER_ID reports it.  Bit 62 keeps it apart
  // from the driver's own ids (a counter from 1).
  unsigned long long buffer_id(std::uint64_t serial) const {
    return (1ULL << 62) | (static_cast<unsigned long long>(index_) << 44) | (serial & ((1ULL << 44) - 1));
  }

  // False once the context was destroyed (see above).
  bool alive() const { return !dead_.load(std::memory_order_acquire); }
  void retire();

  // Stream bookkeeping for the free policy (stream_order.h): fences record
  // on each live non-blocking stream, under the stream set's lock, which the
  // stream-destroy hook also takes (stream_set.h).
  void note_stream(StreamId id, bool non_blocking) {
    if (id != kLegacyStreamId) order_.note_stream(id, non_blocking);
  }
  // Work may reach streams no hook sees (link_imports.h); this context
  // current.
  void note_unseen_streams() { order_.note_unseen_streams(false); }
  void note_foreign_stream(StreamId id) { order_.note_foreign_stream(id); }
  // Called before the real cuStreamDestroy, with this context current:
  // drops the stream and makes the blocks cached on it wait for its work
  // (the handle may be reused).
  void retire_stream(StreamId id);
  // The first capture in flight in this context is about to begin, and the
  // last one ended (capture_tracking.cpp decides, entry_points.cpp passes
  // it on; stream_order.h, note (3)).
  void capture_beginning(bool strict_elsewhere) { order_.capture_beginning(strict_elsewhere); }
  void captures_ended() { order_.captures_ended(); }
  // True once two streams were seen that the driver does not order with
  // each other (stream_order.h); read on every free.
  bool multi_stream() const { return order_.multi_stream(); }
  // The live non-blocking streams (the host cache's fences cover them too).
  const StreamSet& nonblocking_streams() const { return order_.nonblocking(); }

  // Frees that arrive while a graph capture is in flight can neither record
  // an event on the legacy stream nor synchronize (either would break the
  // capture): the block stays allocated until the capture ends.
  // Returns false if `ptr` is already waiting (a double free).
  bool defer_free(DevicePtr ptr);
  bool has_deferred() const { return deferred_count_.load(std::memory_order_relaxed) != 0; }
  std::vector<DevicePtr> take_deferred();

 private:
  CUcontext ctx_;
  int device_;
  std::size_t device_total_;
  unsigned index_;  // creation order in the process
  FreeSync free_sync_;
  CudaBackend backend_;
  std::unique_ptr<CachingAllocator> allocator_;
  std::atomic<bool> dead_{false};
  mutable std::mutex mutex_;
  StreamOrder order_;
  std::set<DevicePtr> deferred_;
  std::atomic<std::size_t> deferred_count_{0};
};

namespace detail {
// The last (context, state) this thread used: the common case needs no lock.
struct LastUsed {
  CUcontext ctx = nullptr;
  ContextState* state = nullptr;
};
extern constinit thread_local LastUsed t_last;
ContextState* find_current_state(CUcontext ctx, const RealDriver* d);
}  // namespace detail

// The state of the calling thread's current context, created on first use.
// nullptr when no context is current, the context is unusable (destroyed)
// or the driver reports an error (then the caller passes the call to the
// driver, which reports it exactly).  Inline: every allocation and free
// asks, and the driver's answer is almost always the context asked last.
[[gnu::always_inline]] inline ContextState* current_context_state() {
  const RealDriver* d = real_driver();
  CUcontext ctx = nullptr;
  if (d->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == nullptr) return nullptr;
  const detail::LastUsed& last = detail::t_last;
  if (last.ctx == ctx && last.state->alive()) [[likely]] return last.state;
  return detail::find_current_state(ctx, d);
}

// The live state of `ctx`, or nullptr (never creates one).
ContextState* live_state_of(CUcontext ctx);

// The live context whose allocator owns `ptr` (inside one of its segments),
// the current context first; nullptr if none.
ContextState* find_owner(DevicePtr ptr);
// The same, with what that allocator knows about `ptr`.
ContextState* find_owner(DevicePtr ptr, AddressInfo* info);

// The driver destroyed `ctx`: retire its state (see above).  Returns the
// state retired, or nullptr when `ctx` had no live one.  `report_async`:
// log an error when blocks served for a stream (cuMemAllocAsync) were still
// allocated; the pluggable ABI, whose blocks all have a stream, says what
// died itself.
ContextState* forget_context(CUcontext ctx, bool report_async = true);

// Called by forget_context with each state it retired, after the
// registry's lock is released.  The pinned host cache sets it when it is
// created (host_ops.cpp: its blocks of the context leave it), so that this
// file, below the host hooks, calls nothing above it.  Set once, before
// the listener has anything to do; nullptr: nobody listens.
using ContextRetiredFn = void (*)(ContextState* state);
void set_context_retired_listener(ContextRetiredFn fn);

// What a context's new cache asks of the floors above this file (the link
// imports, link_imports.h), handed down at start-up (start_up.cpp) before
// any cache exists, so that this file calls nothing above it:
// `start_outside_sequence`, in the state's constructor: whether it starts
// outside the single sequence; `created`, once it is in the registry: a
// look at objects loaded since the last one (which may make every live
// context leave the single sequence).  Unset: nothing is asked.
struct ContextCreationHooks {
  bool (*start_outside_sequence)() noexcept = nullptr;
  void (*created)() noexcept = nullptr;
};
void set_context_creation_hooks(const ContextCreationHooks& hooks);

// Peer access (cuCtxEnablePeerAccess from `accessor`, a context of device
// `accessor_device`, to memory of `peer`): remembered so that the peer's
// expandable pages, mapped now or later, grant that device access.
void peer_access_enabled(CUcontext accessor, int accessor_device, CUcontext peer);
void peer_access_disabled(CUcontext accessor, int accessor_device, CUcontext peer);

// How many contexts have a live cache (one relaxed load).
std::size_t live_context_count();

// The contexts with a live cache now.
std::vector<ContextState*> live_context_states();

// Every context seen so far, retired ones included (for reports).  The
// pointers stay valid forever.
std::vector<ContextState*> all_context_states();

// Makes `ctx` current for the lifetime of the guard when it is not already.
class ContextGuard {
 public:
  ContextGuard(const RealDriver* d, CUcontext ctx);
  ~ContextGuard();
  ContextGuard(const ContextGuard&) = delete;
  ContextGuard& operator=(const ContextGuard&) = delete;

 private:
  const RealDriver* d_;
  CUcontext previous_ = nullptr;
  bool switched_ = false;
};

}  // namespace cachalloc::shim
