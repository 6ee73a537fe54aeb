// context_registry.h — one CachingAllocator per CUcontext.
//
// Memory of one context is not usable in another, so each context gets its
// own allocator and backend, created the first time an allocation is made
// with it current.  Per context the registry also keeps what the free
// policy needs: the live streams the program created or used, and whether
// per-thread default streams were used, and from how many threads.
// Contexts are never destroyed here: allocators live until the process
// ends, so no driver call happens from a static destructor.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <vector>

#include "caching_allocator.h"
#include "cuda_backend.h"
#include "real_driver.h"
#include "stream_ids.h"

namespace cachalloc::shim {

class ContextState {
 public:
  ContextState(CUcontext ctx, CUdevice device, const RealDriver* driver, const Config& config);

  CUcontext context() const { return ctx_; }
  int device() const { return device_; }
  std::size_t device_total() const { return device_total_; }  // bytes, from cuMemGetInfo at creation
  CachingAllocator& allocator() { return *allocator_; }

  // Stream bookkeeping for the free policy.
  void note_stream(StreamId id);   // a stream created or used (not the legacy one)
  void forget_stream(StreamId id); // destroyed
  // Called before the real cuStreamDestroy: waits for in-flight fenced
  // frees (which may be recording events on the stream), drops the stream
  // from the fence list and makes the blocks cached on it wait for its work.
  void retire_stream(StreamId id);
  // Held (shared) by a fenced free from taking the stream list to recording
  // its events, so no stream in the list is destroyed in between.
  std::shared_mutex& stream_lifetime() { return stream_lifetime_; }
  // True once anything but the legacy default stream was seen.
  bool multi_stream() const { return multi_stream_.load(std::memory_order_relaxed); }
  // True once a per-thread default stream of a thread other than the caller
  // was used: the caller cannot record an event on it.
  bool other_threads_per_thread_streams() const {
    const int n = ptds_threads_.load(std::memory_order_relaxed);
    return n > 1 || (n == 1 && first_ptds_token_.load(std::memory_order_relaxed) != per_thread_stream_id());
  }
  // The streams a fenced free must wait for, as seen from the calling
  // thread: the legacy stream, every live stream, this thread's per-thread
  // stream if it was used.
  std::vector<StreamId> fence_streams() const;

 private:
  CUcontext ctx_;
  int device_;
  std::size_t device_total_ = 0;
  CudaBackend backend_;
  std::unique_ptr<CachingAllocator> allocator_;
  mutable std::mutex mutex_;
  std::shared_mutex stream_lifetime_;
  std::set<StreamId> streams_;       // live created/used streams
  std::set<StreamId> ptds_tokens_;   // per-thread default streams seen
  std::atomic<bool> multi_stream_{false};
  std::atomic<int> ptds_threads_{0};
  std::atomic<StreamId> first_ptds_token_{0};
};

// The state of the calling thread's current context, created on first use.
// nullptr when no context is current or the driver reports an error (then
// the caller passes the call to the driver, which reports it exactly).
ContextState* current_context_state();

// The context whose allocator owns `ptr` as a live block or segment part,
// searching every context; nullptr if none.
ContextState* find_owner(DevicePtr ptr);

// Every context seen so far (for reports).  The pointers stay valid forever.
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
