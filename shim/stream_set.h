// stream_set.h — one context's live non-blocking streams, for fences.
//
// A fence (CudaBackend::fence_record) records one event on the legacy
// stream, which orders after all earlier work on every blocking stream
// (per-thread default streams included), and covers each live
// non-blocking stream, which the legacy stream does not order: a query, and
// an event if the stream is busy.  Recording on (or querying) a stream
// another thread has just destroyed crashes inside libcuda, so
// the set's lock orders the two: a fence records while holding it, and the
// stream-destroy hook removes the stream under it *before* the real
// cuStreamDestroy.  A stream is therefore either still in the set and alive
// for the whole fence, or out of the set before the fence looks.
#pragma once

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

#include "types.h"

namespace cachalloc::shim {

class StreamSet {
 public:
  void add(StreamId id) {
    std::lock_guard lock(mutex_);
    if (std::find(ids_.begin(), ids_.end(), id) != ids_.end()) return;
    ids_.push_back(id);
    count_.store(ids_.size(), std::memory_order_relaxed);
  }
  // Waits for a fence in progress (see above).
  void remove(StreamId id) {
    std::lock_guard lock(mutex_);
    std::erase(ids_, id);
    count_.store(ids_.size(), std::memory_order_relaxed);
  }
  std::size_t size() const { return count_.load(std::memory_order_relaxed); }
  bool contains(StreamId id) const {
    if (size() == 0) return false;
    std::lock_guard lock(mutex_);
    return std::find(ids_.begin(), ids_.end(), id) != ids_.end();
  }

  // Calls fn(StreamId) for every stream, holding the lock throughout: no
  // stream of the set is destroyed meanwhile.  Stops at the first fn that
  // returns false; returns whether all returned true.
  template <typename Fn>
  bool for_each_locked(Fn&& fn) const {
    std::lock_guard lock(mutex_);
    for (StreamId id : ids_)
      if (!fn(id)) return false;
    return true;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<StreamId> ids_;
  std::atomic<std::size_t> count_{0};
};

}  // namespace cachalloc::shim
