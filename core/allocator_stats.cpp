// allocator_stats.cpp — AllocatorStats as DeviceStats, and its resets
// (allocator_stats.h says how the stored counters map to the read ones).
#include "allocator_stats.h"

namespace cachalloc {

Stat PoolStats::operator[](StatType t) const {
  if (t == StatType::small_pool) return stat_of(pool_[0]);
  if (t == StatType::large_pool) return stat_of(pool_[1]);
  const Stat s = stat_of(pool_[0]);
  const Stat l = stat_of(pool_[1]);
  return {s.current + l.current, aggregate_peak_, s.allocated + l.allocated, s.freed + l.freed};
}

StatArray PoolStats::get() const {
  StatArray out;
  for (StatType t : {StatType::aggregate, StatType::small_pool, StatType::large_pool}) out[t] = (*this)[t];
  return out;
}

void PoolStats::reset_peak() {
  for (Counter& c : pool_) c.peak = c.current;
  aggregate_peak_ = pool_[0].current + pool_[1].current;
}

void PoolStats::reset_accumulated() {
  for (Counter& c : pool_) {
    c.allocated = 0;
    c.base = c.current;
  }
}

namespace {
// `p` with the held block's reuses added to its accumulated counts.
StatArray with_reuses(PoolStats p, const std::int64_t (&n)[2]) {
  p.cycle(true, n[0]);
  p.cycle(false, n[1]);
  return p.get();
}
}  // namespace

DeviceStats AllocatorStats::get() const {
  DeviceStats d;
  d.allocation = with_reuses(allocation, reuses);
  d.segment = segment.get();
  d.active = with_reuses(active, reuses);
  d.inactive_split = inactive_split.get();
  d.allocated_bytes = with_reuses(allocated_bytes, reused_bytes);
  d.reserved_bytes = reserved_bytes.get();
  d.active_bytes = with_reuses(active_bytes, reused_bytes);
  d.inactive_split_bytes = inactive_split_bytes.get();
  d.requested_bytes = requested_bytes.get();
  d.num_alloc_retries = num_alloc_retries;
  d.num_ooms = num_ooms;
  d.oversize_allocations = oversize_allocations;
  d.oversize_segments = oversize_segments;
  d.num_sync_all_streams = num_sync_all_streams;
  d.num_device_alloc = num_device_alloc;
  d.num_device_free = num_device_free;
  d.max_split_size = max_split_size;
  d.num_deferred_frees = num_deferred_frees;
  d.num_fences = num_fences;
  d.num_fence_events = num_fence_events;
  d.num_fence_stream_queries = num_fence_stream_queries;
  d.num_fence_waits = num_fence_waits;
  d.num_fence_joins = num_fence_joins;
  d.num_peak_releases = num_peak_releases;
  d.peak_release_bytes = peak_release_bytes;
  d.num_peak_remaps = num_peak_remaps;
  d.peak_remap_bytes = peak_remap_bytes;
  d.num_thread_cache_locked_allocs = num_thread_cache_locked_allocs;
  d.num_thread_fence_polls_not_ready = num_thread_fence_polls_not_ready;
  d.num_cross_stream_reuses = num_cross_stream_reuses;
  d.deferred_free_bytes = deferred_free_bytes;
  d.capture_held_bytes = capture_held_bytes;
  return d;
}

// As DeviceStats::reset_peak / reset_accumulated (stats.cpp), field for field.
template <class Fn>
void AllocatorStats::for_each_stat(Fn fn) {
  for (PoolStats* p : {&allocation, &segment, &active, &inactive_split, &allocated_bytes, &reserved_bytes,
                       &active_bytes, &inactive_split_bytes, &requested_bytes})
    fn(*p);
  fn(oversize_allocations);
  fn(oversize_segments);
  fn(deferred_free_bytes);
  fn(capture_held_bytes);
}

void AllocatorStats::reset_peak() {
  for_each_stat([](auto& s) { s.reset_peak(); });
}

void AllocatorStats::reset_accumulated() {
  for_each_stat([](auto& s) { s.reset_accumulated(); });
  reuses[0] = reuses[1] = reused_bytes[0] = reused_bytes[1] = 0;
  reset_counters(*this);
}

}  // namespace cachalloc
