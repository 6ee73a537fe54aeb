// context_registry.h — one CachingAllocator per CUcontext.
//
// Memory of one context is not usable in another, so each context gets its
// own allocator and backend, created the first time an allocation is made
// with it current.  Per context the registry also keeps what the free
// policy needs: whether any stream but the legacy one was seen, the live
// non-blocking streams, and frees deferred by a graph capture.
// Contexts are never destroyed here: allocators live until the process
// ends, so no driver call happens from a static destructor.
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

namespace cachalloc::shim {

class ContextState {
 public:
  ContextState(CUcontext ctx, CUdevice device, const RealDriver* driver, const Config& config);

  CUcontext context() const { return ctx_; }
  int device() const { return device_; }
  std::size_t device_total() const { return device_total_; }  // bytes, from cuMemGetInfo at creation
  CachingAllocator& allocator() { return *allocator_; }

  // Stream bookkeeping for the free policy.  The shim records events only
  // on the legacy stream and on a stream the program is handing it in the
  // same call: a handle kept from earlier may have been destroyed by a path
  // no hook sees, and an event recorded on a dead stream crashes the driver.
  void note_stream(StreamId id, bool non_blocking);  // created or used (not legacy)
  void forget_stream(StreamId id);                   // destroyed
  // Called before the real cuStreamDestroy: drops the stream and makes the
  // blocks cached on it wait for its work (the handle may be reused).
  void retire_stream(StreamId id);
  // True once anything but the legacy default stream was seen.
  bool multi_stream() const { return multi_stream_.load(std::memory_order_relaxed); }
  // True while a non-blocking stream is (as far as the hooks know) alive:
  // work on it is not ordered by the legacy stream, so only a device
  // synchronization covers it.
  bool nonblocking_streams_live() const { return nonblocking_live_.load(std::memory_order_relaxed) > 0; }

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
  std::size_t device_total_ = 0;
  CudaBackend backend_;
  std::unique_ptr<CachingAllocator> allocator_;
  mutable std::mutex mutex_;
  std::set<StreamId> nonblocking_;   // live non-blocking streams
  std::atomic<bool> multi_stream_{false};
  std::atomic<std::size_t> nonblocking_live_{0};
  std::set<DevicePtr> deferred_;
  std::atomic<std::size_t> deferred_count_{0};
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
