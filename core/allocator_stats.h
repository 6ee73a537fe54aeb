// allocator_stats.h — the allocator's statistics, kept for cheap updates.
//
// DeviceStats (stats.h) is what callers read: per statistic an aggregate
// and two pools, each with current, peak, allocated and freed.  Updating it
// as stored costs two Stats per change, and a decrease writes two fields of
// each.  A cached malloc+free pair changes about a dozen statistics, so
// here each pool keeps only current, peak and allocated, plus `base`, its
// current at the last reset of the accumulated counts:
//   freed            = allocated - current + base  (every decrease lowers
//                      current and raises freed by as much; a reset zeroes
//                      allocated and freed)
//   aggregate        = the two pools' sums, except the peak, which is kept
//                      (a peak of the sum is not the sum of the peaks).
// A decrease is then one subtraction.  get() gives the StatArray exactly as
// stats.h would have counted it, at any moment: the values are the same
// integers, only derived when read.
#pragma once

#include <cstdint>

#include "stats.h"

namespace cachalloc {

class PoolStats {
 public:
  void increase(bool small, std::int64_t amount) {
    Counter& c = pool_[small ? 0 : 1];
    c.current += amount;
    c.allocated += amount;
    if (c.current > c.peak) c.peak = c.current;
    const std::int64_t total = pool_[0].current + pool_[1].current;
    if (total > aggregate_peak_) aggregate_peak_ = total;
  }
  void decrease(bool small, std::int64_t amount) { pool_[small ? 0 : 1].current -= amount; }
  // A decrease and an increase of `amount` that cancel (a held block's free
  // and reuse, reuse_path.h): current and the peaks stay, only the
  // accumulated counts move.
  void cycle(bool small, std::int64_t amount) { pool_[small ? 0 : 1].allocated += amount; }
  // An increase of `amount` and the decrease that undoes it: the peaks the
  // increase would have reached, and the accumulated counts.
  void touch(bool small, std::int64_t amount) {
    Counter& c = pool_[small ? 0 : 1];
    c.allocated += amount;
    if (c.current + amount > c.peak) c.peak = c.current + amount;
    const std::int64_t total = pool_[0].current + pool_[1].current + amount;
    if (total > aggregate_peak_) aggregate_peak_ = total;
  }

  // A decrease of `old_amount` and an increase of `amount` (a held block's
  // free and reuse for another request size): peaks are compared only when
  // current ends higher, since they already cover the old value.
  void replace(bool small, std::int64_t old_amount, std::int64_t amount) {
    Counter& c = pool_[small ? 0 : 1];
    c.current += amount - old_amount;
    c.allocated += amount;
    if (amount > old_amount) [[unlikely]] {
      if (c.current > c.peak) c.peak = c.current;
      const std::int64_t total = pool_[0].current + pool_[1].current;
      if (total > aggregate_peak_) aggregate_peak_ = total;
    }
  }

  // Deltas a thread cache gathered (thread_cache.h, ThreadDelta): current
  // and accumulated counts move by `current` and `allocated`; the peaks
  // cover the highest current the cache reached since its last merge.
  void adjust(bool small, std::int64_t current, std::int64_t allocated, std::int64_t high) {
    Counter& c = pool_[small ? 0 : 1];
    if (c.current + high > c.peak) c.peak = c.current + high;
    const std::int64_t total = pool_[0].current + pool_[1].current + high;
    if (total > aggregate_peak_) aggregate_peak_ = total;
    c.current += current;
    c.allocated += allocated;
  }

  // The Stat of one entry (aggregate, small or large pool), as stats.h has it.
  Stat operator[](StatType t) const;
  StatArray get() const;
  void reset_peak();
  void reset_accumulated();

 private:
  struct Counter {
    std::int64_t current = 0;
    std::int64_t peak = 0;
    std::int64_t allocated = 0;
    std::int64_t base = 0;  // current when the accumulated counts were last reset
  };
  Stat stat_of(const Counter& c) const { return {c.current, c.peak, c.allocated, c.allocated - c.current + c.base}; }

  Counter pool_[2];  // small, large
  std::int64_t aggregate_peak_ = 0;
};

// DeviceStats' fields under the same names, the pool arrays as PoolStats.
struct AllocatorStats {
  PoolStats allocation;
  PoolStats segment;
  PoolStats active;
  PoolStats inactive_split;
  PoolStats allocated_bytes;
  PoolStats reserved_bytes;
  PoolStats active_bytes;
  PoolStats inactive_split_bytes;
  PoolStats requested_bytes;

  std::int64_t num_alloc_retries = 0;
  std::int64_t num_ooms = 0;
  Stat oversize_allocations;
  Stat oversize_segments;
  std::int64_t num_sync_all_streams = 0;
  std::int64_t num_device_alloc = 0;
  std::int64_t num_device_free = 0;
  std::int64_t max_split_size = 0;
  std::int64_t num_deferred_frees = 0;
  std::int64_t num_fences = 0;
  std::int64_t num_fence_events = 0;
  std::int64_t num_fence_stream_queries = 0;
  std::int64_t num_fence_waits = 0;
  std::int64_t num_fence_joins = 0;
  std::int64_t num_peak_releases = 0;
  std::int64_t peak_release_bytes = 0;
  std::int64_t num_peak_remaps = 0;
  std::int64_t peak_remap_bytes = 0;
  std::int64_t num_thread_cache_locked_allocs = 0;
  std::int64_t num_thread_fence_polls_not_ready = 0;
  std::int64_t num_cross_stream_reuses = 0;
  Stat deferred_free_bytes;
  Stat capture_held_bytes;  // DeviceStats::capture_held_bytes

  // The reuses of a held block (reuse_path.h), per pool (small, large):
  // each adds one to allocation's and active's accumulated counts and its
  // bytes to allocated_bytes' and active_bytes', here rather than in four
  // counters; get() adds them, reset_accumulated() zeroes them.
  std::int64_t reuses[2] = {0, 0};
  std::int64_t reused_bytes[2] = {0, 0};
  void count_reuse(bool small, std::int64_t bytes) {
    const int i = small ? 0 : 1;
    ++reuses[i];
    reused_bytes[i] += bytes;
  }

  DeviceStats get() const;
  void reset_peak();
  void reset_accumulated();

 private:
  // fn on every PoolStats and Stat field.
  template <class Fn>
  void for_each_stat(Fn fn);
};

}  // namespace cachalloc
