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
  static_cast<SharedStats&>(d) = *this;
  d.allocation = with_reuses(allocation, reuses);
  d.segment = segment.get();
  d.active = with_reuses(active, reuses);
  d.inactive_split = inactive_split.get();
  d.allocated_bytes = with_reuses(allocated_bytes, reused_bytes);
  d.reserved_bytes = reserved_bytes.get();
  d.active_bytes = with_reuses(active_bytes, reused_bytes);
  d.inactive_split_bytes = inactive_split_bytes.get();
  d.requested_bytes = requested_bytes.get();
  return d;
}

// As DeviceStats::reset_peak / reset_accumulated (stats.cpp), field for field.
template <class Fn>
void AllocatorStats::for_each_stat(Fn fn) {
  for (PoolStats* p : {&allocation, &segment, &active, &inactive_split, &allocated_bytes, &reserved_bytes,
                       &active_bytes, &inactive_split_bytes, &requested_bytes})
    fn(*p);
  for_each_shared_stat(fn);
}

void AllocatorStats::reset_peak() {
  for_each_stat([](auto& s) { s.reset_peak(); });
}

void AllocatorStats::reset_accumulated() {
  for_each_stat([](auto& s) { s.reset_accumulated(); });
  reuses[0] = reuses[1] = reused_bytes[0] = reused_bytes[1] = 0;
  reset_counters();
}

}  // namespace cachalloc
